"""gate.verify(): the whole gate for one baseline/candidate pair, with real curves from the proxy.

Config check first; if it passes, the proxy trains the baseline replicates and the candidate,
the curves folder and its PNG are written into workdir, the convergence check runs, and the
steps are doubled while the verdict asks for more (at most MAX_DOUBLINGS times).

Replicates: `replicates` runs under the baseline's data order (same seed checkpoint, different
run-to-run noise) and, when the candidate's layout changes the DP degree and with it the data
order, ORDER_REPLICATES more runs of the baseline under the candidate's data order. One of those
would let the candidate pair with a replicate that saw its batches; two also calibrate the noise
on those batches (with one, the proxy study rejected 5 of 5 benign layouts).
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from attune.errors import InputError
from attune.files import atomic_write_text
from attune.proxy.config import ProxyConfig, proxy_config
from attune.proxy.train import ProxyRun, run
from attune.recipe import Recipe
from attune.gate.config_check import check_config
from attune.gate.convergence import check_convergence
from attune.gate.curves import write_folder as write_curves_folder
from attune.gate.models import ConfigVerdict, GateReport

DEFAULT_STEPS = 40
MAX_DOUBLINGS = 2
ORDER_REPLICATES = 2
CANDIDATE_NOISE = 999
CONFIRM_NOISE = 1999
_CACHE: dict[str, ProxyRun] = {}


def tier_of(config: ConfigVerdict) -> str:
    return "numerics" if config.numerics_change else "exact"


def plan_runs(baseline: Recipe, candidate: Recipe, steps: int, replicates: int, seed: int,
              faults: tuple[str, ...] = ()) -> dict[str, ProxyConfig]:
    """Proxy configs of one comparison: baseline-1..k and candidate."""
    cand = proxy_config(candidate, steps=steps, seed=seed, noise_seed=CANDIDATE_NOISE, faults=faults)
    base = [proxy_config(baseline, steps=steps, seed=seed, noise_seed=i) for i in range(1, replicates + 1)]
    if cand.global_batch != base[0].global_batch:  # equal recipes' global batches scaled differently
        raise InputError("proxy", f"baseline and candidate scale to different proxy batches "
                                  f"({base[0].global_batch} vs {cand.global_batch} samples)")
    if cand.data_order != base[0].data_order:
        base += [proxy_config(baseline, steps=steps, seed=seed, noise_seed=100 + i, data_dp=cand.data_order)
                 for i in range(1, ORDER_REPLICATES + 1)]
    plan = {f"baseline-{i}": cfg for i, cfg in enumerate(base, start=1)}
    plan["candidate"] = cand
    return plan


REPO = Path(__file__).resolve().parent.parent


def _digest(paths: list[Path], length: int) -> str:
    digest = hashlib.sha1()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:length]


def _sources(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.py")) + sorted(folder.glob("*.toml"))


@functools.cache
def _source_version() -> str:
    """The proxy's code: proxy runs cached on disk are keyed by it."""
    return _digest(_sources(REPO / "attune" / "proxy"), 10)


@functools.cache
def code_version() -> str:
    """A digest of the code a verdict depends on: the gate, the proxy, and the torchtitan overrides
    its real-trainer runs load. Cached verdicts are keyed by it, so a changed gate never reuses
    what an older one decided."""
    overrides = REPO / "attune" / "stacks" / "torchtitan"
    return _digest(_sources(REPO / "gate") + _sources(REPO / "attune" / "proxy")
                   + [overrides / name for name in ("recorder.py", "faults.py", "cpu.py")], 12)


def _key(cfg: ProxyConfig) -> str:
    return hashlib.sha1(cfg.model_dump_json().encode()).hexdigest()


def _disk_cache() -> Path | None:
    # Off unless ATTUNE_PROXY_CACHE names a folder: identical runs (same config, same proxy source)
    # are then shared across processes, e.g. benchmark campaigns that train the same baseline.
    folder = os.environ.get("ATTUNE_PROXY_CACHE")
    return Path(folder) / _source_version() if folder else None


def run_all(configs: list[ProxyConfig], workers: int = 1) -> list[ProxyRun]:
    """Proxy runs for the configs, reusing identical runs within this process (replicates shared
    by several candidates); `workers` > 1 runs them in parallel processes."""
    disk = _disk_cache()
    todo: list[ProxyConfig] = []
    for cfg in configs:
        key = _key(cfg)
        if key not in _CACHE and disk is not None and (disk / f"{key}.json").is_file():
            try:
                _CACHE[key] = ProxyRun.model_validate_json((disk / f"{key}.json").read_text())
            except ValueError:
                pass  # unreadable entry: train it again (and overwrite it)
        if key not in _CACHE and cfg not in todo:
            todo.append(cfg)
    if workers > 1 and len(todo) > 1:
        with ProcessPoolExecutor(min(workers, len(todo))) as pool:
            results = list(pool.map(run, todo))
    else:
        results = [run(cfg) for cfg in todo]
    for cfg, result in zip(todo, results):
        _CACHE[_key(cfg)] = result
        if disk is not None:  # written whole, then renamed: concurrent readers never see half a run
            atomic_write_text(disk / f"{_key(cfg)}.json", result.model_dump_json())
    return [_CACHE[_key(cfg)] for cfg in configs]


def write_folder(folder: Path, runs: dict[str, ProxyRun], manifest: dict) -> Path:
    """The curves folder of proxy runs."""
    return write_curves_folder(folder, {n: ([r.model_dump() for r in run.rows], run.step1) for n, run in runs.items()},
                               manifest, {n: r.config.model_dump() | {"seconds": round(r.seconds, 2)}
                                          for n, r in runs.items()})


def _curves_only(verdict) -> bool:
    kinds = {c.kind for c in verdict.checks if not c.passed}
    return verdict.verdict == "failed" and kinds == {"curve"}


def converge(baseline: Recipe, candidate: Recipe, config: ConfigVerdict, workdir: Path, steps: int,
             replicates: int, seed: int, faults: tuple[str, ...] = (), workers: int = 1):
    """Proxy runs + convergence check, doubling the steps while the verdict asks for more.

    A candidate that fails on the curves alone (data, step-1 and invariant checks all passed) is
    run once more with an independent noise draw, and fails only if that run fails too: how far
    two runs drift apart is heavy-tailed (measured on the dense proxy: one noise draw in six put
    a legitimate TP/PP layout outside the band), while a real fault repeats.
    """
    max_steps = steps * 2 ** MAX_DOUBLINGS
    manifest = {"tier": tier_of(config), "numerics_change": [n.field for n in config.numerics_change]}
    noise, first = CANDIDATE_NOISE, None
    while True:
        plan = plan_runs(baseline, candidate, steps, replicates, seed, faults)
        plan["candidate"] = plan["candidate"].model_copy(update={"noise_seed": noise})
        runs = dict(zip(plan, run_all(list(plan.values()), workers)))
        folder = write_folder(workdir / "curves", runs, manifest)
        verdict = check_convergence(folder, workdir, max_steps=max_steps)
        if verdict.verdict == "inconclusive" and verdict.need_more_steps is not None:
            steps = verdict.need_more_steps
            continue
        if first is None and _curves_only(verdict):
            first, noise = verdict, CONFIRM_NOISE
            continue
        if first is not None:
            verdict.reason = (f"confirmation run (independent noise draw): {verdict.reason}; the first run "
                              f"failed on the curves only ({first.statistic.get('name')} at "
                              f"{first.statistic.get('ratio')} of its limit)")
        return verdict


def verify(baseline: Recipe, candidate: Recipe, workdir: Path, steps: int | None = None,
           replicates: int = 3, seed: int = 0) -> GateReport:
    """The gate: config check, then (if it passes) real proxy curves and the convergence check."""
    start = time.perf_counter()
    if replicates < 2:
        raise ValueError("replicates must be >= 2: the tolerance is calibrated from their spread")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config = check_config(baseline, candidate)
    if not config.passed:
        return GateReport(passed=False, config=config, convergence=None,
                          note="config check failed: the proxy was not run",
                          seconds=round(time.perf_counter() - start, 2))
    verdict = converge(baseline, candidate, config, workdir, steps or DEFAULT_STEPS, replicates, seed)
    return GateReport(passed=verdict.passed, verdict=verdict.verdict, config=config, convergence=verdict,
                      steps_used=verdict.steps_used, plot=verdict.plot,
                      note=f"proxy: {verdict.replicates} replicates, {verdict.mode}, tier {verdict.tier}",
                      seconds=round(time.perf_counter() - start, 2))
