"""The convergence check: the candidate's curves against a band calibrated on the baseline replicates.

Order of evidence, cheapest and most sensitive first:
  data identity   with batch hashes, the candidate must have seen the batches of some replicate
                  (the replicates define the legitimate data orders: the baseline's, and the
                  candidate layout's when it changes the DP degree)
  step 1          forward loss, gradient norms (total and per group), a gradient sketch, the LR,
                  update norms, the post-clip invariant, the eval loss after one update
  curves          loss, fixed-batch eval loss and log grad-norm over every step: level, slope,
                  final window and sup of the standardised difference (gate/stats.py)
Without batch hashes or ids (curves exported from another trainer), which replicates saw the
candidate's batches is inferred from the curves (gate/pairing.py): same-data runs' step-to-step
loss movements correlate far beyond what independent batches give. The optional columns a trainer
can export are used when every run has them: `lr` (the schedule must equal the replicates'),
`tokens` (the tokens each step's loss covered must equal the same-data replicates', or on average
all replicates'), and `grad_norm` at the first common step (where no step-1 record exists).

A verdict is passed, failed or inconclusive. Sequential: a candidate inside every limit but past
EDGE of one curve limit is inconclusive; with `max_steps` (the gate's own runs) the verdict asks
for twice the steps until max_steps, where it passes; without (curves brought as files) it says how
many steps would decide it, from the power of the statistic near its edge: the run length at which
the same standardised difference, with the null spread of that many steps, reaches the limit.
Step-1 and data checks do not improve with more steps, so a failure there is final.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from attune.gate import pairing as pairing_mod
from attune.gate.curves import CurveSet, read_curves
from attune.gate.models import Check, ConvergenceVerdict
from attune.gate.plot import plot_verdict
from attune.gate.stats import EDGE, INFLATE_SINGLE, LIMITS, compare
from attune.gate.step1 import M as STEP1_M, SCALARS, _calibrated, invariant_checks, step1_checks

LR_RTOL = 1e-6        # the lr column: relative difference tolerated beyond the replicates' own
ESTIMATE_CAP = 64     # inconclusive: an estimate past this many times the steps held is reported as "more than"


def _groups(curves: CurveSet, infer: bool = True) -> tuple[list[list[int]], list[int], str, dict]:
    """Replicate indices grouped by identical batch streams, the candidate's group, how it was found
    (batch_ids | inferred | none) and the inference's evidence."""
    everyone = list(range(len(curves.baselines)))
    if curves.has_hashes:
        groups: dict[tuple, list[int]] = {}
        for i, b in enumerate(curves.baselines):
            groups.setdefault(tuple(b.hashes), []).append(i)
        return list(groups.values()), groups.get(tuple(curves.candidate.hashes), []), "batch_ids", {}
    if not infer:
        return [everyone], [], "none", {}
    runs = curves.baselines + [curves.candidate]
    found = pairing_mod.infer(np.stack([np.asarray(r.columns["loss"], float) for r in runs]))
    if found is None:
        return [everyone], [], "none", {"note": f"fewer than {pairing_mod.MIN_STEPS} common steps: "
                                                f"no pairing inferred"}
    evidence = found.evidence([r.name for r in runs])
    return found.groups, found.mine, ("inferred" if found.mine else "none"), evidence


def _data_check(curves: CurveSet, mine: list[int]) -> list[Check]:
    if not curves.has_hashes:
        return []
    if mine:
        return [Check(name="data.identity", kind="data", passed=True,
                      detail="same batches as " + ", ".join(curves.baselines[i].name for i in mine))]
    cand = curves.candidate.hashes
    first = min(next((t for t, (a, b) in enumerate(zip(cand, r.hashes)) if a != b), len(cand))
                for r in curves.baselines)
    repeats = len(cand) - len(set(cand))
    detail = f"the candidate's batches match no replicate's (first difference at step {curves.candidate.steps[first]})"
    if repeats and all(len(set(r.hashes)) == len(r.hashes) for r in curves.baselines):
        detail += f"; it trains on {repeats} repeated batch(es)"
    return [Check(name="data.identity", kind="data", value=float(first), passed=False, detail=detail)]


def _series(curves: CurveSet, metric: str) -> tuple[np.ndarray, np.ndarray]:
    take = (lambda v: np.log(np.asarray(v, float))) if metric == "grad_norm" else (lambda v: np.asarray(v, float))
    reps = np.stack([take(b.columns[metric]) for b in curves.baselines])
    return take(curves.candidate.columns[metric]), reps


def _column(curves: CurveSet, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    runs = curves.baselines + [curves.candidate]
    if not all(name in r.columns for r in runs):
        return None
    return (np.asarray(curves.candidate.columns[name], float),
            np.stack([np.asarray(b.columns[name], float) for b in curves.baselines]))


def _max_rel(x: np.ndarray, ref: np.ndarray) -> tuple[float, int]:
    dev = np.abs(x - ref) / np.maximum(np.abs(ref), 1e-30)
    i = int(np.argmax(dev))
    return float(dev[i]), i


def _column_checks(curves: CurveSet, refs: list[int], paired: bool, tier: str) -> list[Check]:
    """Checks on the optional columns an outside trainer exports: lr, tokens, the first grad_norm."""
    checks: list[Check] = []
    steps = curves.candidate.steps
    lr = _column(curves, "lr")
    if lr is not None:   # the schedule does not depend on the data order: every replicate counts
        cand, reps = lr
        ref = reps.mean(0)
        value, at = _max_rel(cand, ref)
        own = max((_max_rel(r, np.delete(reps, i, 0).mean(0))[0] for i, r in enumerate(reps)), default=0.0)
        tol = max(STEP1_M * own, LR_RTOL)
        differ = int((np.abs(cand - ref) / np.maximum(np.abs(ref), 1e-30) > tol).sum())
        checks.append(Check(name="invariant.lr", kind="invariant", value=value, tolerance=tol, passed=value <= tol,
                            detail=(f"the learning rate differs from the replicates' at {differ} of {len(steps)} "
                                    f"steps, most at step {steps[at]} ({cand[at]:.6g} vs {ref[at]:.6g})")
                            if differ else "the learning rate equals the replicates' at every common step"))
    tokens = _column(curves, "tokens")
    if tokens is not None:
        cand, reps = tokens
        if paired:   # the same batches: the same tokens, step by step
            mine = reps[refs]
            ref = mine.mean(0)
            value, at = _max_rel(cand, ref)
            own = max((_max_rel(r, np.delete(mine, i, 0).mean(0))[0] for i, r in enumerate(mine)), default=0.0) \
                if len(refs) >= 2 else 0.0
            tol = STEP1_M * own
            where = f"most at step {steps[at]} ({cand[at]:.6g} vs {ref[at]:.6g})"
        else:        # other batches: the same tokens on average
            totals = reps.mean(1)
            ref_total = float(totals.mean())
            value = abs(float(cand.mean()) - ref_total) / max(abs(ref_total), 1e-30)
            own = max((abs(t - np.delete(totals, i).mean()) / max(abs(np.delete(totals, i).mean()), 1e-30)
                       for i, t in enumerate(totals)), default=0.0)
            tol = max(STEP1_M * float(own), 1e-9)
            where = f"mean per step {float(cand.mean()):.6g} vs {ref_total:.6g}"
        ok = value <= tol
        checks.append(Check(name="data.tokens", kind="data", value=value, tolerance=tol, passed=ok,
                            detail=("tokens per step equal the replicates'" if ok else
                                    f"the candidate's loss covers other tokens than the replicates': {where}")
                            + (" (same batches)" if paired else " (other batches: compared on average)")))
    grad = _column(curves, "grad_norm")
    if grad is not None and curves.candidate.step1 is None:
        cand, reps = grad
        pool = refs if paired and len(refs) >= 2 else list(range(len(curves.baselines)))
        floor = SCALARS["grad_norm"][1 if tier == "exact" else 2]
        value, tol = _calibrated("log", float(cand[0]), [float(r) for r in reps[pool, 0]], floor)
        checks.append(Check(name="first_step.grad_norm", kind="step1", value=value, tolerance=tol,
                            passed=abs(value) <= tol,
                            detail=f"log ratio of the gradient norm at step {steps[0]}, the first every run "
                                   f"logged ({cand[0]:.6g} vs {float(reps[pool, 0].mean()):.6g}, "
                                   f"{'same-data' if pool is refs else 'all'} replicates)"))
    return checks


def _curve_checks(curves: CurveSet, groups: list[list[int]], refs: list[int], paired: bool, adaptive: bool = True):
    checks, bands, zs = [], {}, {}
    null = [g for g in groups if len(g) >= 2] if paired else [list(range(len(curves.baselines)))]
    inflate = INFLATE_SINGLE if paired and len(refs) == 1 else 1.0
    for metric in curves.metrics:
        cand, reps = _series(curves, metric)
        result = compare(cand, reps[refs], [reps[g] for g in null], metric, inflate, adaptive=adaptive)
        zs[metric] = result
        for stat, value in result["stats"].items():
            checks.append(Check(name=f"curve.{metric}.{stat}", kind="curve", value=value, tolerance=LIMITS[stat],
                                passed=abs(value) <= LIMITS[stat],
                                detail=f"{'paired' if paired else 'unpaired'}, spread df={result['df']}, "
                                       f"persistent share of the noise {result['rho']:.2f}"))
        half = LIMITS["level"] * result["sd"]
        bands[metric] = {"step": [float(s) for s in curves.candidate.steps],
                         "center": [round(float(v), 7) for v in result["center"]],
                         "halfwidth": [round(float(v), 7) for v in half]}
    return checks, bands, zs


def _steps_to_decide(check: Check, zs: dict, steps: list[int]) -> tuple[int, str]:
    """The run length (last step) at which the near-edge statistic would reach its limit if the
    standardised difference behind it stays as it is. A mean of z over n steps has null spread
    sqrt((1 - rho) / n + rho) (gate/stats.py), and the upper bound rho narrows with the length
    (raw + margin / sqrt(T)); the first length of 1.25, 1.5, 2, 3, 4, 6, 8 ... times the steps held
    at which the statistic reaches its limit is the answer. Where the noise is persistent (rho = 1),
    more steps do not sharpen the statistic: then twice the steps, the sequential rule's doubling."""
    from attune.gate.stats import PERSIST_MARGIN

    _, metric, stat = check.name.split(".")
    persist = zs[metric]["persistence"]
    T = len(steps)
    window = {"level": 1.0, "final": 0.25, "sup": 0.1, "slope": 0.25}[stat]

    def spread(length: float, rho: float) -> float:
        return math.sqrt((1 - rho) / max(1.0, window * length) + rho)

    if persist["raw"] is None:
        return 2 * steps[-1], "the replicates' noise is persistent, so more steps decide only by the rule's doubling"
    effect = abs(check.value) * spread(T, persist["rho"])          # the difference in units of z
    factor = 1.25
    while factor <= ESTIMATE_CAP:
        length = factor * T
        rho = min(1.0, persist["raw"] + PERSIST_MARGIN / math.sqrt(length * persist["series"]))
        if effect / spread(length, rho) >= check.tolerance:
            return math.ceil(factor * steps[-1]), "estimated from the statistic's power at that length, if the " \
                                                  "difference persists"
        factor = factor * 1.5 if factor < 2 else factor * 4 / 3 if factor < 8 else factor * 2
    return ESTIMATE_CAP * steps[-1], (f"more than {ESTIMATE_CAP} times the steps held: the difference is too "
                                      f"small for this noise to decide in practice")


def check_convergence(curves_dir: Path | str, out_dir: Path | str | None = None,
                      max_steps: int | None = None, infer_pairing: bool = True, adaptive: bool = True,
                      plot: bool = True) -> ConvergenceVerdict:
    """Verdict on the curves folder; the PNG goes to out_dir (default: the curves folder).

    infer_pairing=False judges curves without batch ids unpaired, adaptive=False treats z as fully
    correlated whatever the replicates show (both together: the gate before 2026-12-05, for
    comparisons); plot=False writes no PNG."""
    curves_dir = Path(curves_dir)
    curves = read_curves(curves_dir)
    tier = curves.manifest.get("tier", "exact")
    groups, mine, how, evidence = _groups(curves, infer_pairing)
    paired = tier == "exact" and bool(mine) and any(len(g) >= 2 for g in groups)
    if how == "inferred" and not paired:
        evidence["note"] = ("the candidate shares batches with " + ", ".join(evidence["paired_with"]) +
                            (" but no two replicates share batches to calibrate the noise" if tier == "exact"
                             else ", but a numerics change is compared unpaired"))
        how = "none"
    refs = mine if paired else list(range(len(curves.baselines)))
    checks = _data_check(curves, mine)
    records = [b.step1 for b in curves.baselines]
    if curves.candidate.step1 is not None and all(r is not None for r in records):
        checks += step1_checks(curves.candidate.step1, records, tier)
    elif curves.candidate.step1 is not None:
        checks += invariant_checks(curves.candidate.step1)
    checks += _column_checks(curves, refs, paired, tier)
    curve_checks, bands, zs = _curve_checks(curves, groups, refs, paired, adaptive)
    checks += curve_checks
    steps = len(curves.candidate.steps)
    last = curves.candidate.steps[-1]
    fired = [c.name for c in checks if not c.passed]
    worst = max(checks, key=lambda c: c.ratio)
    near = max(curve_checks, key=lambda c: c.ratio, default=None)
    edge = near.ratio if near is not None else 0.0
    need = None
    if fired:
        outcome, reason = "failed", f"{len(fired)} check(s) outside tolerance, worst {worst.name}"
    elif edge > EDGE and max_steps is not None and steps < max_steps:
        need = min(2 * steps, max_steps)
        outcome, reason = "inconclusive", f"inside the band but near its edge ({near.name} at {edge:.0%} of its " \
                                          f"limit): run {need} steps"
    elif edge > EDGE and max_steps is None:
        need, how_known = _steps_to_decide(near, zs, curves.candidate.steps)
        outcome = "inconclusive"
        reason = (f"inconclusive: inside every limit but near the edge ({near.name} at {edge:.0%} of its limit); "
                  f"about {need} steps would decide it ({how_known}); the files hold {last}")
    else:
        outcome = "passed"
        reason = "every check inside its calibrated tolerance" + \
            (f" (near the edge at the step bound {max_steps})" if edge > EDGE else "")
    if not any(c.kind == "step1" for c in checks):
        reason += "; no step-1 records: step-1 checks skipped"
    if curves.alignment.get("dropped"):
        reason += (f"; compared on the {steps} steps every run logged "
                   f"({', '.join(f'{n}: {k} more' for n, k in curves.alignment['dropped'].items())})")
    if how == "inferred":
        reason += "; paired by the curves' batch-to-batch movements with " + ", ".join(evidence["paired_with"])
    names = [curves.baselines[i].name for i in refs] if paired else []
    verdict = ConvergenceVerdict(
        passed=outcome == "passed", verdict=outcome, need_more_steps=need, reason=reason,
        mode="paired" if paired else "unpaired", paired_with=names, pairing=how if paired else "none",
        pairing_evidence=evidence, tier=tier, steps_used=steps, last_step=last, alignment=curves.alignment,
        replicates=len(curves.baselines),
        statistic={"name": worst.name, "value": worst.value, "tolerance": worst.tolerance,
                   "ratio": round(worst.ratio, 4) if np.isfinite(worst.ratio) else None},
        band=bands, fired=fired, checks=checks)
    if plot:
        out = Path(out_dir) if out_dir is not None else curves_dir
        out.mkdir(parents=True, exist_ok=True)
        verdict.plot = str(plot_verdict(curves, zs, verdict, out / "gate.png"))
    return verdict
