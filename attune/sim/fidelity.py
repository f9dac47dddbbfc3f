"""How good a guide the public estimator is on one simulated cluster: the evaluator's measurement.

It reads the ground truth (tests/test_sim_honesty.py allows this file) to report what a planner
can never see: the estimator's error per layout and whether its ranking finds the truth's best.
benchmarks/bench_worlds.py prints it per world; no planner calls it.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import spearmanr

from attune.recipe import Recipe
from attune.sim.estimator import estimate_many
from attune.sim.ground_truth import measure_many
from attune.sim.space_arrays import space_arrays
from attune.sim.worlds import DEFAULT_WORLD

TOP = 100   # the estimator's best-ranked layouts the rank correlation is taken over


def estimator_fidelity(recipe: Recipe, cluster_seed: int, world: str = DEFAULT_WORLD, sample: int = 2000,
                       seed: int = 0) -> dict[str, float]:
    """The estimator against the ground truth on one cluster of the recipe.

      median_error, p90_error  |estimated / true step time - 1| over a random sample of valid layouts
      rank_correlation         Spearman's rho of estimated and true throughput over the estimator's
                               TOP best-ranked layouts (those it predicts to fit)
      top1_share               true throughput of the estimator's best layout / the truth's best
                               (0 if it does not fit on the cluster)
      top10_share              the same for the best of its top 10
    """
    space = space_arrays(recipe)
    est, truth = estimate_many(recipe, space), measure_many(recipe, space, cluster_seed, world)
    pick = np.random.default_rng(seed).choice(len(space), size=min(sample, len(space)), replace=False)
    errors = np.abs(est["step_s"][pick] / truth["step_s"][pick] - 1.0)
    true_tps = np.where(truth["fits"], truth["tps"], 0.0)
    order = np.flatnonzero(est["fits"])
    order = order[np.argsort(-est["tps"][order], kind="stable")]
    top = order[:TOP]
    rho = float(spearmanr(est["tps"][top], true_tps[top]).statistic) if len(top) > 2 else float("nan")
    best = float(true_tps.max())
    return {"median_error": float(np.median(errors)), "p90_error": float(np.percentile(errors, 90)),
            "rank_correlation": rho, "top1_share": float(true_tps[order[0]] / best) if len(order) else 0.0,
            "top10_share": float(true_tps[order[:10]].max() / best) if len(order) else 0.0}
