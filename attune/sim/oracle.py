"""The oracle: exhaustive search of a recipe's lever space on the ground truth, noise off.

It answers "what is the best a tuner could have found on this simulated cluster", so campaigns can
be scored against it. Objective settings stay fixed; the space is attune.space's (vectorised in
attune/sim/space_arrays.py). `truth_tps` scores one layout a campaign already chose. This module
is the evaluator's door to the ground truth: planners must never call it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from attune.layout import Layout
from attune.recipe import Recipe
from attune.sim.ground_truth import fitting_mask, measure_many
from attune.sim.space_arrays import iter_space
from attune.sim.worlds import DEFAULT_WORLD


class OracleBest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    levers: dict[str, Any]
    tokens_per_sec_per_gpu: float
    step_time_s: float
    peak_memory_gib: float
    mfu: float


class OracleResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    best: OracleBest | None            # None when no layout fits in memory
    evaluated: int                     # valid layouts evaluated (memory for all, time for those that fit)
    fitting: int                       # of which fit in device memory
    seconds: float
    cluster_seed: int
    world: str = DEFAULT_WORLD
    simulated: bool = True


def truth_tps(recipe: Recipe, layout: Layout | None = None, cluster_seed: int = 0, world: str = DEFAULT_WORLD) -> float:
    """Noise-free ground-truth tokens/s/GPU of one layout (the recipe's own by default); 0 if it
    does not fit in memory."""
    cols = measure_many(recipe, [layout or recipe.layout()], cluster_seed, world)
    return float(cols["tps"][0]) if bool(cols["fits"][0]) else 0.0


def oracle(recipe: Recipe, cluster_seed: int = 0, progress=None, world: str = DEFAULT_WORLD) -> OracleResult:
    """Best levers and throughput over every valid layout; `progress(evaluated)` after each chunk."""
    t0 = time.perf_counter()
    evaluated = fitting = 0
    best: tuple[float, Any, int, dict] | None = None
    for chunk in iter_space(recipe):
        evaluated += len(chunk)
        fit = fitting_mask(recipe, chunk, cluster_seed, world)   # memory first: most of a big space does not fit
        fitting += int(fit.sum())
        if not fit.any():
            continue
        la = chunk.take(fit)
        cols = measure_many(recipe, la, cluster_seed, world)
        tps = np.where(cols["fits"], cols["tps"], -np.inf)
        i = int(np.argmax(tps))
        if np.isfinite(tps[i]) and (best is None or tps[i] > best[0]):
            best = (float(tps[i]), la, i, cols)
        if progress is not None:
            progress(evaluated)
    result = None
    if best is not None:
        tps, la, i, cols = best
        result = OracleBest(levers=la.layout(i).levers(), tokens_per_sec_per_gpu=round(tps, 3),
                            step_time_s=round(float(cols["step_s"][i]), 6),
                            peak_memory_gib=round(float(cols["mem_total_gib"][i]), 3),
                            mfu=round(float(cols["mfu"][i]), 5))
    return OracleResult(best=result, evaluated=evaluated, fitting=fitting,
                        seconds=round(time.perf_counter() - t0, 3), cluster_seed=cluster_seed,
                        world=world)
