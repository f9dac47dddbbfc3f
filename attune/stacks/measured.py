"""The measured stack: trials replayed from a table of real runs, two or more per layout.

    stack = MeasuredStack(table="sweep.jsonl")      # or ATTUNE_MEASURED_TABLE=sweep.jsonl
    result = stack.run_trial(recipe, steps=10, seed=3, workdir=Path("t"))

A benchmark that compares planners on hardware cannot afford to run every planner's every trial
for real, and runs that happen hours apart on a shared machine are not comparable anyway. So each
layout of the space is run for real a few times (benchmarks/bench_cpu_hardware.py, `sweep`: every
layout once, then every layout again) and a trial here returns one of those runs, drawn with the
trial's seed: its measured step times resampled (the step-to-step spread), its start-up as measured,
its peak memory and its ending (a crash stays a crash). Which run is drawn is the run-to-run part of
the noise, so a confirmation does not simply repeat the luck of the search run it confirms (a table
of one run per layout draws that part from `run_sd`, a spread measured on another sweep; with two
runs or more a smaller factor is drawn on top, so that two draws of one run are not identical). A
trial reports the median of its steps, as the torchtitan stack does, and a layout's throughput
(the oracle's statistic) is the mean of its runs' medians. A layout whose measured peak exceeds
the cluster's memory ends as an out-of-memory trial after its first step, as the CPU memory
monitor would end it.

Planners see only what they measure, as on any stack: the wall-time estimate is torchtitan's public
prior, never the table. A layout the table lacks is an error naming it, never a guess.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from attune.errors import InputError
from attune.recipe import Recipe
from attune.stacks.base import StepMetrics, TrialResult, TrialStatus

TABLE_ENV = "ATTUNE_MEASURED_TABLE"


def layout_key(levers: dict[str, Any]) -> str:
    """The same layout, the same key, whatever the order or JSON round trip of its levers."""
    return json.dumps(sorted((k, v) for k, v in levers.items()), default=str)


def table_options(options: dict[str, Any]) -> dict[str, Any]:
    """The stack options with the table resolved (the option, else ATTUNE_MEASURED_TABLE) and its
    content's digest: both are part of a campaign's identity, so a campaign resumed against another
    table, or the same file changed, is another campaign, never two worlds mixed."""
    table = options.get("table") or os.environ.get(TABLE_ENV)
    if not table:
        raise InputError("--stack measured", f"needs a table of measured runs (stack option table, or {TABLE_ENV})")
    path = Path(table).resolve()
    if not path.is_file():
        raise InputError("table", f"{path} is not a file (run benchmarks/bench_cpu_hardware.py sweep)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    if options.get("table_sha256") not in (None, digest):
        raise InputError("table", f"{path} changed since the campaign started (its digest was "
                                  f"{options['table_sha256']}, it is {digest}); discard the campaign or restore the table")
    return dict(options) | {"table": str(path), "table_sha256": digest}


class MeasuredTable:
    """The sweep's records (one JSON line per run, as bench_cpu_hardware.py writes them), by layout."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise InputError("table", f"{self.path} is not a file (run benchmarks/bench_cpu_hardware.py sweep)")
        self.records: dict[str, list[dict[str, Any]]] = {}
        for r in self.read(self.path):
            self.records.setdefault(layout_key(r["levers"]), []).append(r)

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]

    def runs(self, levers: dict[str, Any]) -> list[dict[str, Any]]:
        key = layout_key(levers)
        if key not in self.records:
            raise InputError("table", f"{self.path.name} has no run of the layout {dict(sorted(levers.items()))}")
        return self.records[key]

    @staticmethod
    def run_tps(run: dict[str, Any]) -> float | None:
        """One run's tokens/s per process: the median of its measured steps (what a trial reports)."""
        steps = [t for t in run.get("step_tps") or [] if t]
        return float(np.median(steps)) if run.get("status") == "ok" and steps else None

    def layout_tps(self, levers: dict[str, Any]) -> float | None:
        """The layout's throughput: the mean of its runs' medians (None if any run failed)."""
        tps = [self.run_tps(r) for r in self.runs(levers)]
        return float(np.mean(tps)) if tps and all(t is not None for t in tps) else None

    def peak_gib(self, levers: dict[str, Any]) -> float | None:
        peaks = [r.get("peak_memory_gib") for r in self.runs(levers) if r.get("peak_memory_gib")]
        return max(peaks) if peaks else None

    def fits(self, levers: dict[str, Any], limit_gib: float) -> bool:
        peak = self.peak_gib(levers)
        return peak is None or peak <= limit_gib

    def run_to_run_sd(self) -> float:
        """The pooled relative spread between runs of the same layout (log of the run medians)."""
        deviations, dof = 0.0, 0
        for runs in self.records.values():
            logs = [np.log(t) for t in (self.run_tps(r) for r in runs) if t]
            if len(logs) > 1:
                deviations += float(np.sum(np.square(np.asarray(logs) - np.mean(logs))))
                dof += len(logs) - 1
        return float(np.sqrt(deviations / dof)) if dof else 0.0


class MeasuredStack:
    name = "measured"

    def __init__(self, table: str | None = None, table_sha256: str | None = None, run_sd: float = 0.0):
        """`run_sd`: for a table with one run per layout, the run-to-run spread (log sd) measured
        elsewhere, drawn per trial as a factor on its throughput (with two runs or more, the runs are it)."""
        options = table_options({"table": table, "table_sha256": table_sha256})
        self.table = MeasuredTable(options["table"])
        self.run_sd = float(run_sd)
        self._pooled_sd = self.table.run_to_run_sd()   # the spread between runs of one layout, whole table
        # torchtitan's own estimate: the prior a live torchtitan campaign starts from (never the table)
        from attune.stacks.torchtitan.stack import TorchtitanStack
        first = next(iter(self.table.records.values()))[0]
        self._estimator = TorchtitanStack(warmup_steps=int(first.get("warmup_steps", 2)), validate=False)

    def estimate_wall_time_s(self, recipe: Recipe, steps: int) -> float:
        return self._estimator.estimate_wall_time_s(recipe, steps)

    def _luck_sd(self, recorded_runs: int) -> float:
        """The spread of the factor drawn on top of the drawn run: `run_sd` for one recorded run; for k
        runs, the table's pooled run-to-run spread over sqrt(k) (a smoothed bootstrap, whose draws then
        vary as much as the runs did). Without it two trials of a two-run layout draw the same run, bit
        for bit, half the time, and a campaign reads "no noise" off them: a random-search campaign on the
        frozen world shipped a layout slower than its baseline past a 0.9% band measured that way."""
        if recorded_runs == 1:
            return self.run_sd
        return self._pooled_sd / float(np.sqrt(recorded_runs))

    def run_trial(self, recipe: Recipe, steps: int, seed: int, workdir: Path) -> TrialResult:
        layout = recipe.layout()
        levers = layout.levers()
        runs = self.table.runs(levers)
        rng = np.random.default_rng(int(hashlib.sha256(f"{seed}|{layout_key(levers)}".encode()).hexdigest()[:12], 16))
        record = runs[int(rng.integers(len(runs)))]
        gpus = recipe.cluster.gpus
        warmup = int(record.get("warmup_steps", 2))
        step_tps = [t for t in record.get("step_tps") or [] if t]
        tokens = layout.tokens_per_step / gpus           # per process per step
        base = {"stack": self.name, "levers": levers, "gpus": gpus, "simulated": False,
                "breakdown": {"hbm_gib": recipe.cluster.memory_gib, "replayed_from": self.table.path.name,
                              "replayed_run": int(record.get("run", 0))}}
        if record["status"] != "ok" or not step_tps:
            return TrialResult(status=TrialStatus(record["status"]) if record["status"] != "ok" else TrialStatus.CRASH,
                               wall_time_s=record["wall_time_s"], message=f"replayed: {record.get('message', '')}",
                               peak_memory_gib=record.get("peak_memory_gib"), **base)
        luck_sd = self._luck_sd(len(runs))
        luck = float(np.exp(rng.normal(0.0, luck_sd))) if luck_sd > 0 else 1.0
        step_s = [tokens / (t * luck) for t in step_tps]
        startup = max(0.0, record["wall_time_s"] - record.get("steps_logged", warmup + len(step_s)) * float(np.mean(step_s)))
        peak = self.table.peak_gib(levers)
        if not self.table.fits(levers, recipe.cluster.memory_gib):
            return TrialResult(status=TrialStatus.OOM, wall_time_s=startup + step_s[0], peak_memory_gib=peak,
                               message=(f"replayed: CPU out of memory: peak resident set {peak:.2f} GiB is above "
                                        f"the {recipe.cluster.memory_gib:g} GiB one process may hold"), **base)
        sampled = rng.choice(step_s, size=max(1, steps))
        median_s = float(np.median(sampled))
        wall = startup + warmup * float(np.mean(step_s)) + float(np.sum(sampled))
        metrics = [StepMetrics(step=warmup + i + 1, tps=tokens / s, memory_gib=record.get("peak_memory_gib"))
                   for i, s in enumerate(sampled)]
        return TrialResult(status=TrialStatus.OK, wall_time_s=wall, tokens_per_sec_per_gpu=tokens / median_s,
                           step_time_s=median_s, peak_memory_gib=record.get("peak_memory_gib"), steps=metrics,
                           message="replayed from a measured run", **base)
