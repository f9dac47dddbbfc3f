"""The measured stack: trials replayed from a table of real runs, one per layout.

    stack = MeasuredStack(table="sweep.jsonl")      # or ATTUNE_MEASURED_TABLE=sweep.jsonl
    result = stack.run_trial(recipe, steps=10, seed=3, workdir=Path("t"))

A benchmark that compares planners on hardware cannot afford to run every planner's every trial
for real, and runs that happen hours apart on a shared machine are not comparable anyway. So each
layout of the space is run once for real (benchmarks/bench_cpu_hardware.py, `sweep`) and a trial
here returns that run: its measured step times resampled with the trial's seed (the trial's noise
is the run's own step-to-step spread), its start-up as measured, its peak memory, and its ending
(a crash stays a crash). A layout whose measured peak exceeds the cluster's memory ends as an
out-of-memory trial after its first step, as the CPU memory monitor would end it.

Planners see only what they measure, as on any stack: the wall-time estimate is torchtitan's public
one, never the table. A layout the table lacks is an error naming it, never a guess.
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


class MeasuredTable:
    """The sweep's records (one JSON line per layout, as bench_cpu_hardware.py writes them)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise InputError("table", f"{self.path} is not a file (run benchmarks/bench_cpu_hardware.py sweep)")
        self.records = {layout_key(r["levers"]): r for r in self.read(self.path)}

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]

    def record(self, levers: dict[str, Any]) -> dict[str, Any]:
        key = layout_key(levers)
        if key not in self.records:
            raise InputError("table", f"{self.path.name} has no run of the layout {dict(sorted(levers.items()))}")
        return self.records[key]

    @staticmethod
    def tps(record: dict[str, Any]) -> float | None:
        """The layout's measured tokens/s per process (the run's median step, as torchtitan's stack
        reports a trial)."""
        if record.get("tokens_per_sec_per_gpu"):
            return float(record["tokens_per_sec_per_gpu"])
        steps = [t for t in record.get("step_tps") or [] if t]
        return float(np.median(steps)) if steps else None

    @staticmethod
    def fits(record: dict[str, Any], limit_gib: float) -> bool:
        peak = record.get("peak_memory_gib")
        return peak is None or peak <= limit_gib


class MeasuredStack:
    name = "measured"

    def __init__(self, table: str | None = None):
        table = table or os.environ.get(TABLE_ENV)
        if not table:
            raise InputError("--stack measured", f"needs a table of measured runs (stack option table, or {TABLE_ENV})")
        self.table = MeasuredTable(table)
        # torchtitan's own estimate, which learns from the runs this stack returns as it would from
        # live ones (and never from the rest of the table)
        from attune.stacks.torchtitan.stack import TorchtitanStack
        warmup = int(next(iter(self.table.records.values()), {}).get("warmup_steps", 2))
        self._estimator = TorchtitanStack(warmup_steps=warmup, validate=False)

    def estimate_wall_time_s(self, recipe: Recipe, steps: int) -> float:
        return self._estimator.estimate_wall_time_s(recipe, steps)

    def run_trial(self, recipe: Recipe, steps: int, seed: int, workdir: Path) -> TrialResult:
        layout = recipe.layout()
        levers = layout.levers()
        record = self.table.record(levers)
        gpus = recipe.cluster.gpus
        warmup = int(record.get("warmup_steps", 2))
        step_tps = [t for t in record.get("step_tps") or [] if t]
        tokens = layout.tokens_per_step / gpus           # per process per step
        base = {"stack": self.name, "levers": levers, "gpus": gpus, "simulated": False,
                "breakdown": {"hbm_gib": recipe.cluster.memory_gib, "replayed_from": self.table.path.name}}
        if record["status"] != "ok" or not step_tps:
            return TrialResult(status=TrialStatus(record["status"]) if record["status"] != "ok" else TrialStatus.CRASH,
                               wall_time_s=record["wall_time_s"], message=f"replayed: {record.get('message', '')}",
                               peak_memory_gib=record.get("peak_memory_gib"), **base)
        step_s = [tokens / t for t in step_tps]
        startup = max(0.0, record["wall_time_s"] - record.get("steps_logged", warmup + len(step_s)) * float(np.mean(step_s)))
        if not MeasuredTable.fits(record, recipe.cluster.memory_gib):
            return TrialResult(status=TrialStatus.OOM, wall_time_s=startup + step_s[0],
                               peak_memory_gib=record["peak_memory_gib"],
                               message=(f"replayed: CPU out of memory: peak resident set {record['peak_memory_gib']:.2f} "
                                        f"GiB is above the {recipe.cluster.memory_gib:g} GiB one process may hold"), **base)
        rng = np.random.default_rng(int(hashlib.sha256(f"{seed}|{layout_key(levers)}".encode()).hexdigest()[:12], 16))
        sampled = rng.choice(step_s, size=max(1, steps))
        mean_s = float(np.mean(sampled))
        wall = startup + warmup * float(np.mean(step_s)) + float(np.sum(sampled))
        metrics = [StepMetrics(step=warmup + i + 1, tps=tokens / s, memory_gib=record.get("peak_memory_gib"))
                   for i, s in enumerate(sampled)]
        self._estimator.learn(recipe, wall, warmup + len(sampled), mean_s)
        return TrialResult(status=TrialStatus.OK, wall_time_s=wall, tokens_per_sec_per_gpu=tokens / mean_s,
                           step_time_s=mean_s, peak_memory_gib=record.get("peak_memory_gib"), steps=metrics,
                           message="replayed from a measured run", **base)
