"""The public step-time and memory estimator: what a planner may consult before measuring.

It is the simulated cluster's physics with no hidden effects and no noise, so it is a good but
imperfect guide (a few percent per layout, with occasional larger misses). Everything it returns
is labelled simulated.

    estimate(recipe)                     -> SimResult for the recipe's own layout
    estimate(recipe, layout)             -> SimResult for another layout of the recipe
    estimate_many(recipe, layouts)       -> columns (numpy arrays) for a list of Layouts
    estimate_many(recipe, space_arrays(recipe)) -> the whole lever space in one pass
                                           (row i is space_arrays(recipe).layout(i))
    estimate_levers(recipe, levers)      -> SimResult for a lever assignment (a Proposal's levers)
    estimate_wall_time_s(recipe, steps)  -> conservative trial wall time (start-up included)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attune.layout import GLOBAL_BATCH, Layout, resolve_layout
from attune.recipe import Recipe
from attune.sim.arrays import LayoutArrays, from_layouts
from attune.sim.hardware import Hardware, hardware
from attune.sim.params import stack_efficiency
from attune.sim.physics import launch_overhead_s
from attune.sim.stepmodel import SimResult, evaluate, result_at

ASYNC_TP_KEY = "parallelism.enable_async_tensor_parallel"
STACK = "torchtitan"   # recipes run torchtitan; other stacks exist only as calibration points


def recipe_hardware(recipe: Recipe) -> Hardware:
    return hardware(recipe.cluster)


def async_tp(recipe: Recipe) -> bool:
    """torchtitan's async TP: a recipe field outside the lever space (it needs compile and tp > 1)."""
    value = recipe.config.get(ASYNC_TP_KEY, False)
    return value is True or str(value).lower() == "true"


def as_arrays(recipe: Recipe, layouts: Sequence[Layout] | LayoutArrays | Layout | None) -> LayoutArrays:
    if layouts is None:
        layouts = [recipe.layout()]
    elif isinstance(layouts, Layout):
        layouts = [layouts]
    arrays = layouts if isinstance(layouts, LayoutArrays) else from_layouts(layouts)
    return arrays.with_async_tp(True) if async_tp(recipe) else arrays


def estimate_many(recipe: Recipe, layouts: Sequence[Layout] | LayoutArrays) -> dict[str, np.ndarray]:
    """Columns over the layouts: step_s, tps, mfu, fits, mem_total_gib and every breakdown part."""
    return evaluate(recipe.architecture, recipe_hardware(recipe), as_arrays(recipe, layouts), STACK)


def estimate(recipe: Recipe, layout: Layout | None = None) -> SimResult:
    cols = estimate_many(recipe, [layout or recipe.layout()])
    return result_at(cols, 0, recipe_hardware(recipe), source="estimator")


def estimate_levers(recipe: Recipe, levers: dict) -> SimResult:
    """The estimate for the recipe with these lever values (global batch held); InputError if invalid."""
    config = dict(recipe.config) | dict(levers)
    config[GLOBAL_BATCH] = recipe.layout().global_batch
    return estimate(recipe, resolve_layout(config, recipe.architecture, recipe.cluster))


def startup_s(recipe: Recipe, layout: Layout | None = None) -> float:
    """Launch, model init and compilation before the first step (what every trial pays)."""
    layout = layout or recipe.layout()
    return launch_overhead_s(recipe.architecture, recipe.cluster.gpus, layout.compile, stack_efficiency(STACK))


def estimate_wall_time_s(recipe: Recipe, steps: int) -> float:
    """Conservative: start-up, the slow first step and `steps` steps, all with a 30% margin (the
    truth's start-up varies by +-10% and its steps by the estimator's error); a layout the
    estimator expects to run out of memory is still charged the full run."""
    eff = stack_efficiency(STACK)
    step = float(estimate_many(recipe, [recipe.layout()])["step_s"][0])
    return 1.3 * (startup_s(recipe) + eff.warmup_s + (max(int(steps), 1) + eff.warmup_steps) * step)
