"""What planners may ask of the public estimator (attune.sim.estimator), in one place.

The estimator is the clean analytic model: it knows nothing of a cluster's hidden effects, so its
absolute numbers are off by a few percent; planners use it for ratios between layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attune.layout import Layout
from attune.recipe import Recipe

MEMORY_HEADROOM = 0.10   # share of GPU memory a layout reached by a jump of several levers must be predicted
                         # to leave free: memory is what a cluster most often contradicts the estimator on
                         # (an out-of-memory trial costs a trial and its retry)


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


class RankedLayouts(Sequence):
    """The estimator's ranking of a whole lever space, best predicted first. Lazy: a 256-GPU MoE
    space holds half a million layouts and a planner reads the first few dozen."""

    def __init__(self, arrays, order, tps):
        self._arrays, self._order, self._tps = arrays, order, tps

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._arrays.layout(int(self._order[i])).levers()


def rank_layouts(recipe: Recipe, headroom: float = 0.0, fit=None) -> RankedLayouts:
    """Every valid layout of the recipe's lever space the estimator predicts to fit, best first;
    with `headroom`, only those predicted to leave that share of GPU memory free; with `fit` (an
    attune.planners.cluster_fit.ClusterFit), the estimator corrected by what trials measured."""
    import numpy as np

    from attune.sim.estimator import as_arrays, estimate_many
    from attune.sim.space_arrays import space_arrays  # the space, vectorised: seconds, not minutes

    arrays = as_arrays(recipe, space_arrays(recipe))
    cols = fit.columns(recipe, arrays) if fit is not None else estimate_many(recipe, arrays)
    fits = np.flatnonzero(cols["fits"] & (cols["mem_total_gib"] <= (1.0 - headroom) * recipe.cluster.memory_gib))
    order = fits[np.argsort(-cols["tps"][fits], kind="stable")]
    return RankedLayouts(arrays, order, cols["tps"])
