"""Baseline planners the benchmark compares `attune` against, all behind the one Planner interface.

  random          uniform over the valid untried layouts the remaining budget can pay for
                  (rejection sampling from the lever product space)
  bayes           Bayesian optimisation with Optuna's TPE sampler; invalid and failed layouts are
                  reported to it as failed trials
  estimator-topk  rank every layout with the public estimator, measure the best-predicted first
                  (the method of NeMo's AutoConfigurator and of estimator-driven tuning agents)
  grid            exhaustive over a coarse grid (powers of 4 for degrees, extremes for batch), in order
Each sees only the measured history and, for estimator-topk, the public estimator.
"""

from __future__ import annotations

import itertools
import random as _random
from dataclasses import dataclass, field
from typing import Any

from attune.errors import InputError
from attune.layout import (AC_MODE, COMPILE, CP, DP_REPLICATE, DP_SHARD, EP, FLOAT8, LOCAL_BATCH, PP, PP_MICROBATCH,
                           PP_SCHEDULE, TP, Layout, resolve_layout)
from attune.levers import Scalar
from attune.planners.base import PlannerView, Proposal
from attune.planners.registry import register_planner
from attune.recipe import Recipe
from attune.space import config_for

SEARCHED = (TP, PP, CP, EP, DP_REPLICATE, LOCAL_BATCH, PP_SCHEDULE, PP_MICROBATCH, AC_MODE, COMPILE, FLOAT8)


def _resolve(recipe: Recipe, assignment: dict[str, Scalar]) -> Layout | None:
    """The layout of a full lever assignment (dp_shard takes the rest), or None if invalid."""
    levers = {k: v for k, v in assignment.items() if k != DP_SHARD} | {DP_SHARD: -1}
    try:
        return resolve_layout(config_for(recipe, levers), recipe.architecture, recipe.cluster)
    except InputError:
        return None


def _tried(view: PlannerView) -> list[dict[str, Scalar]]:
    return [obs.levers for obs in view.history]


def _affordable(view: PlannerView, levers: dict[str, Scalar]) -> bool:
    """Would the budget let this trial start? (The search ends at the first one it would not.)"""
    return view.affordable is None or bool(view.affordable(levers))


@dataclass
class RandomPlanner:
    name: str = "random"
    seed: int = 0
    stop_reason: str = ""
    max_draws: int = 20_000
    max_too_dear: int = 300

    def __post_init__(self):
        self._rng = _random.Random(self.seed)

    def propose(self, view: PlannerView) -> Proposal | None:
        tried = _tried(view)
        too_dear = 0
        for _ in range(self.max_draws):
            draw = {k: self._rng.choice(view.domains[k]) for k in SEARCHED}
            if draw[PP] == 1 and (draw[PP_SCHEDULE] != "1F1B" or draw[PP_MICROBATCH] != 1):
                continue  # pipeline levers mean nothing without a pipeline: count each layout once
            layout = _resolve(view.recipe, draw)
            if layout is None or layout.levers() in tried:
                continue
            if _affordable(view, layout.levers()):
                return Proposal(levers=layout.levers(), rationale="uniform random valid layout")
            too_dear += 1
            if too_dear >= self.max_too_dear:   # the budget left pays for almost nothing: stop looking
                break
        self.stop_reason = "no moves left: no untried valid layout the budget can pay for found"
        return None


@dataclass
class BayesPlanner:
    """Optuna TPE over the categorical lever space; each trial told its measured throughput."""
    name: str = "bayes"
    seed: int = 0
    stop_reason: str = ""
    max_asks: int = 500
    _pending: dict[int, Any] = field(default_factory=dict)

    def __post_init__(self):
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=self.seed))
        self._told = 0
        self._known: set[tuple] = set()

    def _tell_history(self, view: PlannerView) -> None:
        for obs in view.history[self._told:]:
            key = tuple(sorted(obs.levers.items()))
            trial = self._pending.pop(key, None)
            if trial is None:  # a trial this planner did not ask for (the baseline): add it as known
                self._add_known(view, obs)
                continue
            if obs.result.ok:
                self._study.tell(trial, obs.result.tokens_per_sec_per_gpu)
            else:
                self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
        self._told = len(view.history)

    def _add_known(self, view: PlannerView, obs) -> None:
        params = {k: obs.levers.get(k) for k in SEARCHED}
        key = tuple(sorted(params.items()))
        if key in self._known or not obs.result.ok or any(v not in view.domains[k] for k, v in params.items()):
            return
        self._known.add(key)
        dists = {k: self._optuna.distributions.CategoricalDistribution(list(view.domains[k])) for k in SEARCHED}
        self._study.add_trial(self._optuna.trial.create_trial(params=params, distributions=dists,
                                                              value=obs.result.tokens_per_sec_per_gpu))

    def propose(self, view: PlannerView) -> Proposal | None:
        self._tell_history(view)
        tried = _tried(view)
        for _ in range(self.max_asks):
            trial = self._study.ask()
            draw = {k: trial.suggest_categorical(k, list(view.domains[k])) for k in SEARCHED}
            if draw[PP] == 1:
                draw[PP_SCHEDULE], draw[PP_MICROBATCH] = "1F1B", 1
            layout = _resolve(view.recipe, draw)
            if layout is None:   # an invalid layout is a failed trial to the sampler
                self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                continue
            if layout.levers() in tried:   # already measured: tell it what was measured, ask again
                seen = [o for o in view.history if o.levers == layout.levers()]
                if seen[-1].result.ok:
                    self._study.tell(trial, seen[-1].result.tokens_per_sec_per_gpu)
                else:
                    self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                continue
            if not _affordable(view, layout.levers()):   # the budget cannot pay for it: a failure too
                self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                continue
            self._pending[tuple(sorted(layout.levers().items()))] = trial
            return Proposal(levers=layout.levers(), rationale="TPE suggestion")
        self.stop_reason = "no moves left: the sampler found no untried valid layout"
        return None


@dataclass
class EstimatorTopK:
    """Rank the whole space with the public estimator once; measure in predicted order, keep the best."""
    name: str = "estimator-topk"
    seed: int = 0
    stop_reason: str = ""
    k: int | None = None   # None: as many as the budget allows
    max_too_dear: int = 300
    _ranked: Any = None
    _next: int = 0
    _proposed: list[tuple] = field(default_factory=list)

    def propose(self, view: PlannerView) -> Proposal | None:
        if self._ranked is None:
            self._ranked = rank_by_estimator(view.recipe)
        tried = {_key(levers) for levers in _tried(view)}
        measured = sum(1 for key in self._proposed if key in tried)
        if self.k is not None and measured >= self.k:
            self.stop_reason = f"converged: measured the estimator's top {self.k}"
            return None
        too_dear = 0
        while self._next < len(self._ranked):
            rank, levers = self._next, self._ranked[self._next]
            self._next += 1
            if _key(levers) in tried:
                continue
            if _affordable(view, levers):
                self._proposed.append(_key(levers))
                return Proposal(levers=levers, rationale=f"estimator rank {rank + 1}")
            too_dear += 1
            if too_dear >= self.max_too_dear:
                self.stop_reason = (f"budget: the {self.max_too_dear} next best-predicted layouts cost more "
                                    f"than the budget left")
                return None
        self.stop_reason = "no moves left: every layout predicted to fit was measured"
        return None


def _key(levers: dict[str, Scalar]) -> tuple:
    return tuple(sorted(levers.items()))


def rank_by_estimator(recipe: Recipe):
    """Every valid layout predicted to fit, best predicted throughput first (a lazy sequence)."""
    from attune.planners.estimates import rank_layouts
    return rank_layouts(recipe)


@dataclass
class GridPlanner:
    name: str = "grid"
    seed: int = 0
    stop_reason: str = ""
    _grid: list[dict[str, Scalar]] | None = None

    def propose(self, view: PlannerView) -> Proposal | None:
        if self._grid is None:
            self._grid = coarse_grid(view)
        tried = _tried(view)
        for levers in self._grid:
            if levers not in tried and _affordable(view, levers):
                return Proposal(levers=levers, rationale="next coarse-grid point")
        self.stop_reason = "no moves left: the coarse grid is exhausted"
        return None


def coarse_grid(view: PlannerView) -> list[dict[str, Scalar]]:
    d = view.domains

    def coarse(values: list) -> list:
        ints = sorted(values)
        return [v for v in ints if v in (1, 4, 16, 64)] or ints[:1]

    axes = {TP: coarse(d[TP]), PP: coarse(d[PP]), CP: [1], EP: coarse(d[EP]), DP_REPLICATE: [1],
            LOCAL_BATCH: sorted({min(d[LOCAL_BATCH]), max(d[LOCAL_BATCH])}), PP_SCHEDULE: ["1F1B"],
            PP_MICROBATCH: [1], AC_MODE: ["selective", "full"], COMPILE: [True], FLOAT8: ["none"]}
    out = []
    for values in itertools.product(*axes.values()):
        layout = _resolve(view.recipe, dict(zip(axes, values)))
        if layout is not None and layout.levers() not in out:
            out.append(layout.levers())
    return out


for _cls in (RandomPlanner, BayesPlanner, EstimatorTopK, GridPlanner):
    register_planner(_cls.name, lambda seed=0, _cls=_cls, **_: _cls(seed=seed))
