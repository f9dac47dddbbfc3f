"""The convergence check: the candidate's curves against a band calibrated on the baseline replicates.

Order of evidence, cheapest and most sensitive first:
  data identity   with batch hashes, the candidate must have seen the batches of some replicate
                  (the replicates define the legitimate data orders: the baseline's, and the
                  candidate layout's when it changes the DP degree)
  step 1          forward loss, gradient norms (total and per group), a gradient sketch, the LR,
                  update norms, the post-clip invariant, the eval loss after one update
  curves          loss, fixed-batch eval loss and log grad-norm over every step: level, slope,
                  final window and sup of the standardised difference (gate/stats.py)
Sequential: a candidate inside every limit but past EDGE of one curve limit is neither passed nor
failed; the verdict asks for more steps (twice as many) unless `max_steps` is reached. Step-1 and
data checks do not improve with more steps, so a failure there is final.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attune.gate.curves import CurveSet, read_curves
from attune.gate.models import Check, ConvergenceVerdict
from attune.gate.plot import plot_verdict
from attune.gate.stats import EDGE, INFLATE_SINGLE, LIMITS, compare
from attune.gate.step1 import invariant_checks, step1_checks


def _groups(curves: CurveSet) -> tuple[list[list[int]], list[int]]:
    """Replicate indices grouped by identical batch streams, and the candidate's group."""
    if not curves.has_hashes:
        everyone = list(range(len(curves.baselines)))
        return [everyone], []
    groups: dict[tuple, list[int]] = {}
    for i, b in enumerate(curves.baselines):
        groups.setdefault(tuple(b.hashes), []).append(i)
    return list(groups.values()), groups.get(tuple(curves.candidate.hashes), [])


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


def _curve_checks(curves: CurveSet, groups: list[list[int]], refs: list[int], paired: bool):
    checks, bands, zs = [], {}, {}
    null = [g for g in groups if len(g) >= 2] if paired else [list(range(len(curves.baselines)))]
    inflate = INFLATE_SINGLE if paired and len(refs) == 1 else 1.0
    for metric in curves.metrics:
        cand, reps = _series(curves, metric)
        result = compare(cand, reps[refs], [reps[g] for g in null], metric, inflate)
        zs[metric] = result
        for stat, value in result["stats"].items():
            checks.append(Check(name=f"curve.{metric}.{stat}", kind="curve", value=value, tolerance=LIMITS[stat],
                                passed=abs(value) <= LIMITS[stat],
                                detail=f"{'paired' if paired else 'unpaired'}, spread df={result['df']}"))
        half = LIMITS["level"] * result["sd"]
        bands[metric] = {"step": [float(s) for s in curves.candidate.steps],
                         "center": [round(float(v), 7) for v in result["center"]],
                         "halfwidth": [round(float(v), 7) for v in half]}
    return checks, bands, zs


def check_convergence(curves_dir: Path | str, out_dir: Path | str | None = None,
                      max_steps: int | None = None) -> ConvergenceVerdict:
    """Verdict on the curves folder; the PNG goes to out_dir (default: the curves folder)."""
    curves_dir = Path(curves_dir)
    curves = read_curves(curves_dir)
    tier = curves.manifest.get("tier", "exact")
    groups, mine = _groups(curves)
    paired = tier == "exact" and bool(mine) and any(len(g) >= 2 for g in groups)
    refs = mine if paired else list(range(len(curves.baselines)))
    checks = _data_check(curves, mine)
    records = [b.step1 for b in curves.baselines]
    if curves.candidate.step1 is not None and all(r is not None for r in records):
        checks += step1_checks(curves.candidate.step1, records, tier)
    elif curves.candidate.step1 is not None:
        checks += invariant_checks(curves.candidate.step1)
    curve_checks, bands, zs = _curve_checks(curves, groups, refs, paired)
    checks += curve_checks
    steps = len(curves.candidate.steps)
    fired = [c.name for c in checks if not c.passed]
    worst = max(checks, key=lambda c: c.ratio)
    edge = max((c.ratio for c in curve_checks), default=0.0)
    need = None
    if fired:
        passed, reason = False, f"{len(fired)} check(s) outside tolerance, worst {worst.name}"
    elif edge > EDGE and (max_steps is None or steps < max_steps):
        need = 2 * steps if max_steps is None else min(2 * steps, max_steps)
        passed, reason = None, f"inside the band but near its edge ({worst.name} at {edge:.0%} of its limit): " \
                               f"run {need} steps"
    else:
        passed = True
        reason = "every check inside its calibrated tolerance" + \
            (f" (near the edge at the step bound {max_steps})" if edge > EDGE else "")
    if not any(c.kind == "step1" for c in checks):
        reason += "; no step-1 records: step-1 checks skipped"
    names = [curves.baselines[i].name for i in refs] if paired else []
    verdict = ConvergenceVerdict(
        passed=passed, need_more_steps=need, reason=reason, mode="paired" if paired else "unpaired",
        paired_with=names, tier=tier, steps_used=steps, replicates=len(curves.baselines),
        statistic={"name": worst.name, "value": worst.value, "tolerance": worst.tolerance,
                   "ratio": round(worst.ratio, 4) if np.isfinite(worst.ratio) else None},
        band=bands, fired=fired, checks=checks)
    out = Path(out_dir) if out_dir is not None else curves_dir
    out.mkdir(parents=True, exist_ok=True)
    verdict.plot = str(plot_verdict(curves, zs, verdict, out / "gate.png"))
    return verdict
