"""What planners may ask of the public estimator (attune.sim.estimator), in one place.

The estimator is the clean analytic model: it knows nothing of a cluster's hidden effects, so its
absolute numbers are off by a few percent; planners use it for ratios between layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

from attune.layout import Layout
from attune.recipe import Recipe


@dataclass(frozen=True)
class Prediction:
    fits: bool
    tokens_per_sec_per_gpu: float
    peak_memory_gib: float
    step_time_s: float


def predict(recipe: Recipe, layout: Layout) -> Prediction:
    from attune.sim.estimator import estimate  # the public model; never the ground truth

    est = estimate(recipe, layout)
    return Prediction(fits=bool(est.fits), tokens_per_sec_per_gpu=float(est.tokens_per_sec_per_gpu),
                      peak_memory_gib=float(est.peak_memory_gib), step_time_s=float(est.step_time_s))


def rank_layouts(recipe: Recipe) -> list[dict]:
    """Every valid layout of the recipe's lever space the estimator predicts to fit, best first."""
    import numpy as np

    from attune.sim.estimator import estimate_many

    try:
        from attune.sim.space import space_arrays, space_levers  # vectorised enumeration, when present
        arrays = space_arrays(recipe)
        cols = estimate_many(recipe, arrays)
        order = [i for i in np.argsort(-cols["tps"]) if cols["fits"][i]]
        return [space_levers(recipe, arrays, i) for i in order]
    except ImportError:
        from attune.space import iter_layouts
        layouts = list(iter_layouts(recipe))
        cols = estimate_many(recipe, layouts)
        order = [i for i in np.argsort(-cols["tps"]) if cols["fits"][i]]
        return [layouts[i].levers() for i in order]
