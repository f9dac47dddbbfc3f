"""What the `attune` planner believes of every layout before it measures it: its throughput and its
peak memory, each a distribution.

  mean       the public estimator fitted to what the trials' profiler breakdowns measured
             (attune.planners.cluster_fit; `fitted` off, or no trial with a breakdown: the estimator
             as it is, see `profiled`), and for memory the level the runs measured
  residual   a Gaussian process on the log-residual, log(measured) - log(mean), over layout features
             (attune.planners.residual_gp): a measured layout says how far the model is off on
             layouts a few levers away (`correlated` off: only on itself)
  scale      the GP's prior width (the estimator's known error) times a calibration learned out of
             sample: before each trial of a new layout is seen, the belief predicts it, and the miss in
             units of its own predicted sd is kept. If the misses are larger than the belief said, it
             widens; if smaller, it narrows; PRIOR_WEIGHT pseudo-misses of one sd pull it toward the
             prior while there are few (`calibrated` off: the prior width as it is)

A near layout predicted well says little about a far one, so misses are weighed against what the
belief expected at each, not taken as the width themselves: a campaign that measured only
neighbours of its baseline does not think itself sure of the whole space.

An out-of-memory run bounds its layout's peak from below; it enters the memory GP at the limit (a
lower bound taken for a value: its neighbours learn they need at least that much).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attune.planners.cluster_fit import OOM_MARGIN, ClusterFit, fit_from_history
from attune.planners.residual_gp import Prior, ResidualGP, features
from attune.levers import Scalar
from attune.recipe import Recipe
from attune.sim.arrays import LayoutArrays
from attune.space import layout_of

THROUGHPUT_WIDTH = 0.20   # sd of log(measured / estimated) throughput on a cluster the estimator was not calibrated
                          # on: a median miss of 14% in the realistic world (docs/simulator.md) is an sd of 0.21
MEMORY_WIDTH = 0.05       # the same for peak memory: the estimator's memory is calibrated against published runs
                          # (docs/simulator.md), its misses per layout a few percent
MEMORY_NOISE = 0.01       # run-to-run spread of a layout's peak memory (log)
PRIOR_WEIGHT = 2.0        # pseudo-misses of one predicted sd the calibration starts from


@dataclass
class Belief:
    fitted: bool = True
    correlated: bool = True
    calibrated: bool = True
    gp: ResidualGP = field(default_factory=ResidualGP)
    fit: ClusterFit = field(default_factory=ClusterFit)
    z_throughput: list[float] = field(default_factory=list)   # out-of-sample misses in predicted sds
    z_memory: list[float] = field(default_factory=list)
    prior: list = field(default_factory=list)   # an earlier campaign's observations (warm start): GP data
    prior_sd: float = 0.0                       # the log sd they carry beyond run-to-run noise
    _seen: int = 0

    def rows(self, history) -> tuple[list, int]:
        """The observations with a throughput the throughput GP conditions on: this campaign's, then
        the prior's; and how many of them are the prior's."""
        def measured(obs):
            return [o for o in obs if o.result.ok and o.result.tokens_per_sec_per_gpu]
        old = measured(self.prior)
        return measured(history) + old, len(old)

    def update(self, recipe: Recipe, history, noise_sd: float) -> None:
        """Take in the trials not seen yet, each predicted first from those before it."""

        for i in range(self._seen, len(history)):
            obs, earlier = history[i], history[:i]
            new = i > 0 and all(o.levers != obs.levers for o in earlier)
            if new and obs.result.ok and any(o.result.ok for o in earlier):
                here = measured_arrays(recipe, [obs.levers])
                x = features(here)
                mean, sd = self.throughput(recipe, earlier, here, x, noise_sd)
                miss = np.log(obs.result.tokens_per_sec_per_gpu) - mean[0]
                self.z_throughput.append(float(miss / np.sqrt(sd[0] ** 2 + max(noise_sd, 0.005) ** 2)))
                if obs.result.peak_memory_gib:
                    mean, sd = self.memory(recipe, earlier, here, x)
                    miss = np.log(obs.result.peak_memory_gib) - mean[0]
                    self.z_memory.append(float(miss / np.sqrt(sd[0] ** 2 + MEMORY_NOISE ** 2)))
            if self.fitted and profiled(history[: i + 1]):
                self.fit = fit_from_history(recipe, history[: i + 1])
        self._seen = len(history)

    def scale(self, z: list[float]) -> float:
        """How much wider (or narrower) than its prior the belief should be, from its own misses."""
        if not self.calibrated:
            return 1.0
        return float(np.sqrt((np.sum(np.square(z)) + PRIOR_WEIGHT) / (len(z) + PRIOR_WEIGHT)))

    @property
    def throughput_width(self) -> float:
        return THROUGHPUT_WIDTH * self.scale(self.z_throughput)

    @property
    def memory_width(self) -> float:
        return MEMORY_WIDTH * self.scale(self.z_memory)

    # --- the two distributions -------------------------------------------------------------------
    def throughput(self, recipe: Recipe, history, arrays: LayoutArrays, x: np.ndarray, noise_sd: float,
                   priors: list[Prior] = (), columns: dict[str, np.ndarray] | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and sd of log throughput per layout of `arrays` (features `x`), given the history
        (`columns`: the fit's columns of `arrays`, where the caller has them)."""

        fit = self.fit
        model = np.log(np.maximum((columns or fit.columns(recipe, arrays))["tps"], 1e-12))
        ok, old = self.rows(history)
        if not ok:
            return model, np.full(len(model), self.throughput_width)
        seen = measured_arrays(recipe, [o.levers for o in ok])
        residuals = (np.log([o.result.tokens_per_sec_per_gpu for o in ok])
                     - np.log(np.maximum(fit.columns(recipe, seen)["tps"], 1e-12)))
        noise = np.full(len(ok), max(noise_sd, 0.0))
        noise[len(ok) - old:] = np.hypot(noise_sd, self.prior_sd)
        mean, sd = self.gp.posterior(features(seen), residuals, noise, self.throughput_width, x,
                                     priors=priors, correlated=self.correlated)
        return model + mean, sd

    def memory(self, recipe: Recipe, history, arrays: LayoutArrays, x: np.ndarray,
               columns: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Mean and sd of log peak memory per layout: the estimate at the measured level, and the GP."""

        fit = self.fit
        level = np.log(np.maximum((columns or fit.columns(recipe, arrays))["mem_estimate_gib"], 1e-9)
                       * fit.memory_central)
        limit = recipe.cluster.memory_gib
        seen = [o for o in [*history, *self.prior]
                if (o.result.ok and o.result.peak_memory_gib) or o.result.status.value == "oom"]
        if not seen:
            return level, np.full(len(level), self.memory_width)
        at = measured_arrays(recipe, [o.levers for o in seen])
        estimate = np.log(np.maximum(fit.columns(recipe, at)["mem_estimate_gib"], 1e-9) * fit.memory_central)
        peaks = np.log([o.result.peak_memory_gib if o.result.ok else OOM_MARGIN * limit for o in seen])
        mean, sd = self.gp.posterior(features(at), peaks - estimate, MEMORY_NOISE, self.memory_width, x,
                                     correlated=self.correlated)
        return level + mean, np.sqrt(sd ** 2 + MEMORY_NOISE ** 2)


def profiled(history) -> bool:
    """Did any successful trial report a profiler breakdown? Only then is there something of the
    cluster for cluster-fit to learn that the residual GP does not: without one (torchtitan's logs,
    the CPU benchmark's replays) the fit is two level ratios, of the step and of memory. The GP
    learns the level near the measured layouts anyway; far from them, the ratios made the planner
    sure that nothing unmeasured beat its incumbent, and on every measured world of the CPU
    benchmark it stopped short with them (seq128-tight 84.0% of the oracle with, 100.0% without;
    seq128 97.1% and 98.8%; seq512 93.7% and 95.6%)."""
    return any(o.result.ok and o.result.breakdown.get("compute_s") is not None for o in history)


def measured_arrays(recipe: Recipe, levers: list[dict[str, Scalar]]) -> LayoutArrays:
    """The arrays of the layouts a campaign measured (none gives an empty set of the recipe's columns)."""
    from attune.sim.estimator import as_arrays
    return as_arrays(recipe, [layout_of(recipe, lv, check=False) for lv in levers]) if levers else \
        as_arrays(recipe, [recipe.layout()]).take(np.zeros(0, dtype=int))
