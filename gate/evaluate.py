"""`attune gate eval`: run the fault and legitimate suites through the whole gate.

Three suites, on the two trainers the convergence check can read:
  proxy       gate/suite.toml: the CPU proxy (the sim stack's check), faults injected into the proxy
  torchtitan  gate/suite_torchtitan.toml: real torchtitan runs, faults injected into torchtitan by
              override modules (attune/stacks/torchtitan/faults.py)
  historical  gate/suite_historical.toml: real torchtitan runs, each case a silent-correctness bug
              that happened (gate/historical_bugs.toml: tracker and fix), restored in torchtitan by
              attune/stacks/torchtitan/historical_bugs.py; a case may change the base for itself
              (`base_set`: the bug needs padded labels, or a schedule it can act on;
              `base_torchtitan`: another torchtitan recipe of the model, e.g. another loss)
Every case is built from the suite's base recipe by the lever moves (with their compensations)
and raw config fields it names; the config check runs on the recipes, and when it passes the
trainer runs the candidate (with the case's injected faults) against the baseline replicates,
shared by all cases. A fault is caught when the gate fails it; a legitimate case rejected is a
false reject. Per case the report says which checks fired, by kind.
"""

from __future__ import annotations

import csv
import functools
import tempfile
import time
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from attune.layout import apply_levers
from attune.levers import Scalar
from attune.recipe import Recipe, recipe_from_dict
from attune.gate.config_check import check_config
from attune.gate.models import ConvergenceVerdict
from attune.gate.pipeline import DEFAULT_STEPS, converge

SUITE_FILES = {"proxy": Path(__file__).with_name("suite.toml"),
               "torchtitan": Path(__file__).with_name("suite_torchtitan.toml"),
               "historical": Path(__file__).with_name("suite_historical.toml")}
BUGS_FILE = Path(__file__).with_name("historical_bugs.toml")
TRAINER = {"proxy": "proxy", "torchtitan": "torchtitan", "historical": "torchtitan"}
QUICK_STEPS = {"proxy": 12, "torchtitan": 8}
QUICK_REPLICATES = 3


class CaseResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    kind: str
    label: str
    caught: bool | None          # faults and controls: rejected by the gate's checks (not by a crash)
    crashed: bool = False        # a run of the case failed: no verdict, so neither caught nor passed
    false_reject: bool | None    # legitimate: rejected by the gate
    rejected: bool               # the gate's verdict, whatever the kind
    fired: list[str]             # kinds of the checks that failed: config, defect, data, invariant, step1, curve
    checks: list[str]            # the failing checks by name (first few)
    steps_used: int | None
    mode: str | None
    seconds: float
    first_step: int | None = None  # torchtitan: the first step with evidence (first_signal_step)
    bug: str | None = None       # historical: the bug's id in gate/historical_bugs.toml
    tracker: str | None = None
    fix: str | None = None


class EvalReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    faults: int
    caught: int
    crashed: int = 0             # faults whose runs crashed: not counted as caught
    caught_runtime: int
    caught_config_only: int
    legit: int
    false_rejects: int
    numerics: int                # numerics changes (float8): neither fault nor legitimate
    numerics_rejected: int
    steps: int
    seed: int
    seconds: float
    per_case: list[CaseResult]
    trainer: str = "proxy"       # whose runs the convergence check read
    gpu_hours: float = 0.0       # what the torchtitan runs held (processes x wall time)
    suite: str = ""              # proxy | torchtitan | historical
    noise: str = "none"          # torchtitan: replicate noise (torchtitan_runs.NOISE_LEVELS)
    replicates: int = 0


@functools.cache
def suite(name: str = "proxy") -> dict:
    return tomllib.loads(SUITE_FILES[name].read_text())


@functools.cache
def historical_bugs() -> dict[str, dict]:
    return {bug["id"]: bug for bug in tomllib.loads(BUGS_FILE.read_text())["bug"]}


def base_recipe(name: str = "proxy") -> Recipe:
    """The suite's base; the historical suite shares the torchtitan suite's (`base_from`)."""
    own = suite(name)
    source = own.get("base_from", name)
    return recipe_from_dict(tomllib.loads(suite(source)["base"]), origin=f"{SUITE_FILES[source].name} base")


def case_base(base: Recipe, case: dict) -> Recipe:
    """The base a case is judged against: the suite's, with the case's `base_set` fields and
    `base_torchtitan` (another torchtitan recipe of the same model, e.g. one with another loss)."""
    if not case.get("base_set") and not case.get("base_torchtitan"):
        return base
    raw = base.model_dump(exclude_none=True) | {"config": dict(base.config) | case.get("base_set", {})}
    if case.get("base_torchtitan"):
        raw["torchtitan"] = raw["torchtitan"] | case["base_torchtitan"]
    return recipe_from_dict(raw, origin=f"{base.name} + {case['id']} base")


def case_recipe(base: Recipe, case: dict) -> Recipe:
    config: dict[str, Scalar] = dict(base.config)
    if case.get("moves"):
        config = apply_levers(config, case["moves"], base.architecture, base.cluster)
    config |= case.get("set", {})
    return recipe_from_dict(base.model_dump(exclude_none=True) | {"config": config, "name": case["id"]},
                            origin=f"gate/suite.toml {case['id']}")


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def first_signal_step(verdict: ConvergenceVerdict, folder: Path) -> int | None:
    """The first step at which a fired check had its evidence: 1 for step-1 checks, the first step
    whose batch no replicate saw for the data check, the first step whose loss is outside the
    band (center +- halfwidth) for the curve checks. None when nothing fired (or only checks
    without a step, such as the clipping invariant)."""
    kinds = {c.kind for c in verdict.checks if not c.passed}
    found = [1] if "step1" in kinds else []
    cand = _rows(folder / "candidate.csv")
    if "data" in kinds and cand and "batch_hash" in cand[0]:
        reps = [_rows(path) for path in sorted(folder.glob("baseline-*.csv"))]
        for i, row in enumerate(cand):
            if all(i >= len(rep) or rep[i]["batch_hash"] != row["batch_hash"] for rep in reps):
                found.append(int(row["step"]))
                break
    band = verdict.band.get("loss")
    if "curve" in kinds and band:
        loss = {int(row["step"]): float(row["loss"]) for row in cand}
        for step, center, half in zip(band["step"], band["center"], band["halfwidth"]):
            if int(step) in loss and abs(loss[int(step)] - center) > half:
                found.append(int(step))
                break
    return min(found) if found else None


def _case(case: dict, base: Recipe, workdir: Path, steps: int, replicates: int, workers: int,
          seed: int, runner=None, noise: float = 0.0) -> CaseResult:
    start = time.perf_counter()
    base = case_base(base, case)
    candidate = case_recipe(base, case)
    config = check_config(base, candidate)
    fired, names, verdict, first = [], [], None, None
    if not config.passed:
        fired = sorted({"config" for _ in config.violations} | {"defect" for _ in config.defects})
        names = [v.field for v in config.violations] + [d.id for d in config.defects]
    elif runner is not None:  # the real trainer
        from attune.gate import torchtitan_runs
        verdict, failure = torchtitan_runs.converge(base, candidate, config, workdir / case["id"], steps, seed,
                                                    runner, replicates, faults=tuple(case.get("faults", ())),
                                                    noise=noise)
        if verdict is None:
            fired, names = ["run"], [failure]
        else:
            kinds = {c.name: c.kind for c in verdict.checks}
            fired, names = sorted({kinds[n] for n in verdict.fired}), verdict.fired
            first = first_signal_step(verdict, workdir / case["id"] / "curves")
    else:
        verdict = converge(base, candidate, config, workdir / case["id"], steps, replicates, seed=seed,
                           faults=tuple(case.get("faults", ())), workers=workers)
        kinds = {c.name: c.kind for c in verdict.checks}
        fired = sorted({kinds[n] for n in verdict.fired})
        names = verdict.fired
    rejected = not config.passed or verdict is None or not verdict.passed
    # A crashed run leaves no verdict: a campaign would not ship it, but the gate did not detect
    # anything, so it does not count as caught (nor as a legitimate case rejected by a check).
    crashed = config.passed and verdict is None
    fault = case["kind"] in ("fault", "control")  # a control: a real bug expected below any band
    legit = case["kind"] == "legit"
    bug = historical_bugs().get(case["bug"], {}) if case.get("bug") else {}
    return CaseResult(id=case["id"], kind=case["kind"], label=case["label"], rejected=rejected, crashed=crashed,
                      caught=(rejected and not crashed) if fault else None, false_reject=rejected if legit else None,
                      fired=fired, checks=names[:6], steps_used=verdict.steps_used if verdict else None,
                      mode=verdict.mode if verdict else None, seconds=round(time.perf_counter() - start, 2),
                      first_step=first, bug=case.get("bug"), tracker=bug.get("tracker"), fix=bug.get("fix"))


def evaluate(steps: int | None = None, quick: bool = False, workdir: Path | None = None,
             workers: int = 1, only: list[str] | None = None, seed: int = 0, trainer: str = "proxy",
             say=None, suite_name: str | None = None, noise: str = "none") -> EvalReport:
    """The suite through the whole gate. `seed` is the shared initial-weights seed of every run;
    other seeds give independent realisations (a false-reject rate, not just one verdict).
    trainer="torchtitan" runs the real-trainer suite (torchtitan on this machine's CPU);
    suite_name="historical" its suite of real bugs; noise="gpu-like" gives the torchtitan runs
    seeded run-to-run variation (torchtitan_runs.NOISE_LEVELS) and NOISE_REPLICATES replicates."""
    start = time.perf_counter()
    name = suite_name or trainer
    trainer = TRAINER[name]
    runner, noise_level = None, 0.0
    if trainer == "torchtitan":
        from attune.gate import torchtitan_runs
        steps = steps or (QUICK_STEPS[trainer] if quick else torchtitan_runs.DEFAULT_STEPS)
        noise_level = torchtitan_runs.NOISE_LEVELS[noise]
        replicates = torchtitan_runs.NOISE_REPLICATES if noise_level else torchtitan_runs.REPLICATES
    else:
        if noise != "none":
            raise ValueError("replicate noise is for the torchtitan suites (the proxy has its own seeds)")
        steps = steps or (QUICK_STEPS[trainer] if quick else DEFAULT_STEPS)
        replicates = QUICK_REPLICATES if quick else 3
    cases = [c for c in suite(name)["cases"] if (c["id"] in only if only else not quick or c.get("quick"))]
    base = base_recipe(name)
    with tempfile.TemporaryDirectory(prefix="attune-gate-eval-") as tmp:
        root = Path(workdir) if workdir is not None else Path(tmp)
        if trainer == "torchtitan":
            from attune.stacks.torchtitan.stack import TorchtitanStack
            runner = torchtitan_runs.TorchtitanGateRunner(TorchtitanStack(quiet=True), root, say)
        results = []
        for c in cases:
            results.append(_case(c, base, root, steps, replicates, workers, seed, runner, noise_level))
            if say:
                r = results[-1]
                say(f"gate eval {r.id}: {'rejected' if r.rejected else 'passed'} ({r.seconds:.0f} s)")
    faults = [r for r in results if r.kind == "fault"]
    legit = [r for r in results if r.kind == "legit"]
    numerics = [r for r in results if r.kind == "numerics"]
    caught = [r for r in faults if r.caught]
    runtime = [r for r in caught if set(r.fired) - {"config", "defect"}]
    return EvalReport(faults=len(faults), caught=len(caught), crashed=sum(1 for r in faults if r.crashed),
                      caught_runtime=len(runtime),
                      caught_config_only=len(caught) - len(runtime), legit=len(legit),
                      false_rejects=sum(1 for r in legit if r.false_reject), numerics=len(numerics),
                      numerics_rejected=sum(1 for r in numerics if r.rejected), steps=steps, seed=seed,
                      seconds=round(time.perf_counter() - start, 1), per_case=results, trainer=trainer,
                      gpu_hours=round(runner.gpu_hours, 4) if runner else 0.0, suite=name, noise=noise,
                      replicates=replicates)


def table(report: EvalReport) -> str:
    """The per-case table (Markdown), ready for the README."""
    if report.suite == "historical":
        return historical_table(report)
    lines = ["| case | kind | label | checks that fired | verdict | steps |", "| --- | --- | --- | --- | --- | --- |"]
    for r in report.per_case:
        if r.kind == "fault":
            verdict = "caught" if r.caught else ("**crashed** (not counted)" if r.crashed else "**missed**")
        elif r.kind == "legit":
            verdict = "**false reject**" if r.false_reject else "passed"
        else:
            verdict = "rejected (numerics change)" if r.rejected else "passed (numerics change)"
        lines.append(f"| {r.id} | {r.kind} | {r.label} | {', '.join(r.fired) or '-'} | {verdict} | "
                     f"{r.steps_used or '-'} |")
    lines.append("")
    crashed = f", {report.crashed} crashed (not counted)" if report.crashed else ""
    lines.append(f"faults caught: {report.caught}/{report.faults} ({report.caught_runtime} by runtime checks, "
                 f"{report.caught_config_only} by the config check alone{crashed}); legitimate: "
                 f"{report.legit - report.false_rejects}/{report.legit} passed, {report.false_rejects} false "
                 f"rejects; numerics changes: {report.numerics_rejected}/{report.numerics} rejected; "
                 f"{report.steps} steps; {report.seconds:.0f} s; trainer {report.trainer}; noise {report.noise}, "
                 f"{report.replicates} replicates")
    return "\n".join(lines)


def link(url: str | None) -> str:
    """A Markdown link named repo#number (github issue, PR or commit URLs); other text as it is,
    cut at its first colon ('unconfirmed: ...' -> 'unconfirmed')."""
    if not url:
        return "-"
    if not url.startswith("https://github.com/"):
        return url.split(":")[0]
    parts = url.removeprefix("https://github.com/").split("/")
    ref = parts[3][:7] if len(parts) > 3 and parts[2] == "commit" else (parts[3] if len(parts) > 3 else "")
    return f"[{parts[1]}#{ref}]({url})" if parts[2] != "commit" else f"[{parts[1]}@{ref}]({url})"


def historical_table(report: EvalReport) -> str:
    """The historical suite: bug, tracker and fix, caught or not, by which check, after how many steps."""
    lines = ["| bug | what | tracker | fix | caught | checks that fired | first evidence at step | steps run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report.per_case:
        caught = ("yes" if r.caught else ("**crashed** (not counted)" if r.crashed else "**no**")) if r.kind == "fault" else \
            (f"{'yes' if r.caught else 'no'} (control)" if r.kind == "control" else
             ("**false reject**" if r.false_reject else "passed (legit)"))
        lines.append(f"| {r.bug or r.id} | {r.label} | {link(r.tracker)} | {link(r.fix)} | {caught} | "
                     f"{', '.join(r.fired) or '-'} | {r.first_step or '-'} | {r.steps_used or '-'} |")
    controls = [r for r in report.per_case if r.kind == "control"]
    lines.append("")
    lines.append(f"bugs caught: {report.caught}/{report.faults}; controls rejected: "
                 f"{sum(1 for r in controls if r.rejected)}/{len(controls)}; legitimate changes passed: "
                 f"{report.legit - report.false_rejects}/{report.legit}; {report.steps} steps; "
                 f"{report.seconds:.0f} s; noise {report.noise}, {report.replicates} replicates")
    return "\n".join(lines)
