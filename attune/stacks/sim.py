"""The simulated stack: trials on the simulated cluster's ground truth, charged as real ones would be.

    stack = SimStack(cluster_seed=0)                 # same seed = same cluster (and the oracle's)
    stack = SimStack(cluster_seed=3, world="hard")   # a sibling cluster, far from the public model
    stack.estimate_wall_time_s(recipe, steps=20)     # conservative, from the public estimator
    result = stack.run_trial(recipe, steps=20, seed=1, workdir=Path("runs/t1"))

A trial never sleeps: its wall time is computed. It is start-up (launch 60-120 s growing with GPUs
and model size, +-10% per run, plus torch.compile when enabled), a slow first step, and the steps
at the ground truth's step time with run-to-run noise from `seed`. A layout that does not fit
reports OOM, charged start-up plus the first step. With fault_rate > 0 a run sometimes crashes
with an NCCL error or hangs until the watchdog fires (seeded, off by default), so retry paths can
be exercised. Every result says simulated=True.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attune.errors import InputError
from attune.levers import lever_catalog
from attune.recipe import Recipe
from attune.sim.estimator import STACK, estimate_wall_time_s, recipe_hardware, startup_s
from attune.sim.ground_truth import cluster_seed_of, measure_many, step_noise
from attune.sim.params import stack_efficiency
from attune.sim.shapes import torchtitan_flops_per_token
from attune.sim.stepmodel import result_at
from attune.sim.worlds import DEFAULT_WORLD, cluster_text, world_scale
from attune.stacks.base import StepMetrics, TrialResult, TrialStatus

WATCHDOG_S = 600.0   # NCCL watchdog: a hung collective is killed after this long


class SimStack:
    name = "sim"

    def __init__(self, cluster_seed: int = 0, fault_rate: float = 0.0, world: str = DEFAULT_WORLD):
        if not 0.0 <= fault_rate <= 1.0:
            raise InputError("fault_rate", f"must be in [0, 1], got {fault_rate}")
        if int(cluster_seed) < 0:
            raise InputError("--cluster-seed", f"must be >= 0, got {cluster_seed}")
        world_scale(world)   # an unknown world is refused before any trial
        self.cluster_seed = int(cluster_seed)
        self.world = world
        self.fault_rate = float(fault_rate)

    def estimate_wall_time_s(self, recipe: Recipe, steps: int) -> float:
        return estimate_wall_time_s(recipe, steps)

    def run_trial(self, recipe: Recipe, steps: int, seed: int, workdir: Path | None = None) -> TrialResult:
        result = self._run(recipe, max(int(steps), 1), int(seed))
        if workdir is not None:
            path = Path(workdir)
            path.mkdir(parents=True, exist_ok=True)
            (path / "sim_trial.json").write_text(json.dumps(result.model_dump(mode="json"), indent=1))
        return result

    def _run(self, recipe: Recipe, steps: int, seed: int) -> TrialResult:
        gpus = recipe.cluster.gpus
        try:
            layout = recipe.layout()
        except InputError as err:   # torchtitan would refuse the config at start-up
            levers = {k: recipe.config.get(k, lv.default) for k, lv in lever_catalog().items() if lv.speed_only}
            return TrialResult(status=TrialStatus.CRASH, stack=self.name, levers=levers, gpus=gpus, wall_time_s=30.0,
                               simulated=True, message=f"invalid layout ({err}); simulated")
        levers = layout.levers()
        rng = np.random.default_rng([cluster_seed_of(recipe.cluster, recipe.stack, self.cluster_seed) & 0xFFFFFFFF,
                                     seed & 0xFFFFFFFF, 7])
        eff = stack_efficiency(STACK)
        startup = startup_s(recipe, layout) * float(rng.uniform(0.9, 1.1))
        hw = recipe_hardware(recipe)
        cols = measure_many(recipe, [layout], self.cluster_seed, self.world)
        truth = result_at(cols, 0, hw, source="ground_truth")
        step_s = truth.step_time_s
        first_extra = eff.warmup_s + eff.warmup_steps * step_s
        common = dict(stack=self.name, levers=levers, gpus=gpus, simulated=True)

        if not truth.fits:
            memory = {"memory_gib": truth.breakdown["memory_gib"], "hbm_gib": truth.breakdown["hbm_gib"]}
            return TrialResult(status=TrialStatus.OOM, wall_time_s=startup + first_extra + step_s,
                               peak_memory_gib=truth.peak_memory_gib, breakdown=memory, **common,
                               message=(f"CUDA out of memory at step 1: needs {truth.peak_memory_gib:.1f} GiB of "
                                        f"{hw.capacity_gib:g} GiB (simulated)"))

        if self.fault_rate and rng.uniform() < self.fault_rate:
            at = int(rng.integers(1, steps + 1))
            if rng.uniform() < 0.5:
                return TrialResult(status=TrialStatus.NCCL_ERROR, wall_time_s=startup + first_extra + at * step_s,
                                   **common, message=f"NCCL error: unhandled system error at step {at} (simulated fault)")
            return TrialResult(status=TrialStatus.TIMEOUT, wall_time_s=startup + first_extra + at * step_s + WATCHDOG_S,
                               **common, message=f"hang at step {at}: NCCL watchdog timeout after {WATCHDOG_S:.0f} s "
                                                 "(simulated fault)")

        times = step_s * step_noise(recipe, self.cluster_seed, seed, steps)
        tokens = layout.tokens_per_step / gpus
        flops = float(torchtitan_flops_per_token(recipe.architecture, np.array(layout.seq_len)))
        metrics = []
        for i, t in enumerate(times, start=1):
            wall = t + (first_extra if i == 1 else 0.0)
            tps = tokens / wall
            metrics.append(StepMetrics(step=i, memory_gib=round(truth.peak_memory_gib, 2), tps=round(tps, 2),
                                       tflops=round(tps * flops / 1e12, 2), mfu=round(tps * flops / hw.peak_bf16, 5)))
        measured = times[1:] if steps > 1 else times     # like a user, skip the warm-up step
        mean_step = float(np.mean(measured))
        scale = mean_step / step_s
        breakdown = _scaled(truth.breakdown, scale)
        tps = float(np.mean(tokens / measured))
        return TrialResult(status=TrialStatus.OK, wall_time_s=startup + first_extra + float(times.sum()),
                           tokens_per_sec_per_gpu=round(tps, 3), mfu=round(tps * flops / hw.peak_bf16, 5),
                           step_time_s=round(mean_step, 6), peak_memory_gib=truth.peak_memory_gib,
                           breakdown=breakdown, steps=metrics, **common,
                           message=f"simulated: {steps} steps on {recipe.cluster.label} ({cluster_text(self.cluster_seed, self.world)})")




def _scaled(breakdown: dict, factor: float) -> dict:
    """The profiler's view of this run: time parts scaled by the run's noise, memory as is."""
    out = {}
    for key, value in breakdown.items():
        if key.endswith("_s") and isinstance(value, float):
            out[key] = round(value * factor, 6)
        elif key in ("exposed_comm_s", "comm_total_s"):
            out[key] = {k: round(v * factor, 6) for k, v in value.items()}
        else:
            out[key] = value
    return out
