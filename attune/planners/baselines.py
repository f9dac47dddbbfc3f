"""Baseline planners the benchmark compares `attune` against, all behind the one Planner interface.

  random          uniform over the valid untried layouts the remaining budget can pay for
                  (rejection sampling from the lever product space)
  bayes           Bayesian optimisation with Optuna's TPE sampler; invalid and failed layouts are
                  reported to it as failed trials
  bayes-warm      the same, warm-started from the public estimator (its WARM_START best layouts the
                  gate allows are the first trials) and with attune's knowledge of the gate: a layout
                  the config check refuses, or predicted to leave less than MEMORY_HEADROOM of memory
                  free, is a failed trial that is never measured; float8 only where the gate's probe
                  passed it. The strongest thing a practitioner would build with Optuna
  estimator-topk  rank every layout with the public estimator, measure the best-predicted first
                  (the method of NeMo's AutoConfigurator and of estimator-driven tuning agents), with
                  the same gate knowledge: layouts the config check refuses are skipped, float8 ones
                  measured only where the gate's probe passed them, and only layouts predicted to leave
                  MEMORY_HEADROOM of memory free are ranked
  estimator-topk-naive
                  the same ranking without any of that (every layout predicted to fit, in order)
  grid            exhaustive over a coarse grid (powers of 4 for degrees, extremes for batch), in order
Each sees only the measured history and, for the estimator planners, the public estimator. A
refused candidate falls back on the best measured layout without a numerics change, whichever
planner found it (the campaign's fall_back).
"""

from __future__ import annotations

import itertools
import random as _random
from dataclasses import dataclass, field
from typing import Any

from attune.errors import InputError
from attune.layout import (AC_MODE, COMPILE, CP, DP_REPLICATE, DP_SHARD, EP, FLOAT8, LOCAL_BATCH, PP, PP_MICROBATCH,
                           PP_SCHEDULE, TP, Layout)
from attune.levers import Scalar
from attune.planners.base import PlannerView, Proposal
from attune.planners.estimates import MEMORY_HEADROOM
from attune.levers import layout_key
from attune.planners.gate_rules import GateRules
from attune.planners.registry import register_planner
from attune.recipe import Recipe
from attune.space import layout_of

SEARCHED = (TP, PP, CP, EP, DP_REPLICATE, LOCAL_BATCH, PP_SCHEDULE, PP_MICROBATCH, AC_MODE, COMPILE, FLOAT8)
_NO_PIPELINE = ("1F1B", 1)   # what a layout without a pipeline records for the pipeline-only levers


def _searched(view: PlannerView, levers: dict[str, Scalar]) -> dict[str, Scalar]:
    """The sampler's parameters of a layout: without a pipeline, the pipeline-only levers take the
    first value of their domain (a recipe's [search] may leave out what such a layout records)."""
    params = {k: levers.get(k) for k in SEARCHED}
    if params[PP] == 1:
        params[PP_SCHEDULE], params[PP_MICROBATCH] = view.domains[PP_SCHEDULE][0], view.domains[PP_MICROBATCH][0]
    return params


def _resolve(recipe: Recipe, assignment: dict[str, Scalar]) -> Layout | None:
    """The layout of a full lever assignment (dp_shard takes the rest), or None if invalid."""
    levers = {k: v for k, v in assignment.items() if k != DP_SHARD} | {DP_SHARD: -1}
    try:
        return layout_of(recipe, levers)
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
            if draw[PP] == 1:
                if draw[PP_SCHEDULE] != view.domains[PP_SCHEDULE][0] or draw[PP_MICROBATCH] != view.domains[PP_MICROBATCH][0]:
                    continue  # pipeline levers mean nothing without a pipeline: count each layout once
                draw[PP_SCHEDULE], draw[PP_MICROBATCH] = _NO_PIPELINE
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


WARM_START = 3   # bayes-warm: the estimator's best layouts (the gate allows) measured first


@dataclass
class BayesPlanner:
    """Optuna TPE over the categorical lever space; each trial told its measured throughput.
    bayes-warm: warm_start > 0 and gated (see the module docstring)."""
    name: str = "bayes"
    seed: int = 0
    stop_reason: str = ""
    max_asks: int = 500
    warm_start: int = 0
    gated: bool = False
    _pending: dict[int, Any] = field(default_factory=dict)
    gate: GateRules = field(default_factory=GateRules)

    def __post_init__(self):
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=self.seed))
        self._told = 0
        self._known: set[tuple] = set()
        self._warm: set[tuple] = set()   # the warm start's layouts, asked first
        self._warmed = False

    def _enqueue_warm_start(self, view: PlannerView) -> None:
        """The estimator's best layouts the gate allows, leaving MEMORY_HEADROOM free, asked first."""
        ranked = rank_by_estimator(view.recipe, MEMORY_HEADROOM)
        for i in range(min(len(ranked), 5000)):
            levers = ranked[i]
            if self.gated and not gate_allows(self.gate, view.recipe, levers):
                continue
            params = _searched(view, levers)
            if layout_key(params) not in self._warm:
                self._study.enqueue_trial(params)
                self._warm.add(layout_key(params))
            if len(self._warm) >= self.warm_start:
                break

    def _refused(self, view: PlannerView, layout: Layout) -> bool:
        """Gated: a layout the gate would refuse or the estimator says does not fit is never measured."""
        if not self.gated:
            return False
        from attune.planners.estimates import predict
        return not gate_allows(self.gate, view.recipe, layout.levers()) or not predict(view.recipe, layout).fits

    def _tell_history(self, view: PlannerView) -> None:
        for obs in view.history[self._told:]:
            trial = self._pending.pop(layout_key(obs.levers), None)
            if trial is None:  # a trial this planner did not ask for (the baseline): add it as known
                self._add_known(view, obs)
                continue
            if obs.result.ok:
                self._study.tell(trial, obs.result.tokens_per_sec_per_gpu)
            else:
                self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
        self._told = len(view.history)

    def _add_known(self, view: PlannerView, obs) -> None:
        params = _searched(view, obs.levers)
        key = layout_key(params)
        if key in self._known or not obs.result.ok or any(v not in view.domains[k] for k, v in params.items()):
            return
        self._known.add(key)
        dists = {k: self._optuna.distributions.CategoricalDistribution(list(view.domains[k])) for k in SEARCHED}
        self._study.add_trial(self._optuna.trial.create_trial(params=params, distributions=dists,
                                                              value=obs.result.tokens_per_sec_per_gpu))

    def propose(self, view: PlannerView) -> Proposal | None:
        self._tell_history(view)
        self.gate.see(view, probing=self.gated)
        if self.warm_start and not self._warmed:
            self._warmed = True
            self._enqueue_warm_start(view)
        tried = _tried(view)
        for _ in range(self.max_asks):
            trial = self._study.ask()
            draw = {k: trial.suggest_categorical(k, list(view.domains[k])) for k in SEARCHED}
            warm = layout_key(draw) in self._warm
            if draw[PP] == 1:
                draw[PP_SCHEDULE], draw[PP_MICROBATCH] = _NO_PIPELINE
            layout = _resolve(view.recipe, draw)
            if layout is None or self._refused(view, layout):   # a failed trial to the sampler
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
            self._pending[layout_key(layout.levers())] = trial
            why = "the estimator's warm start" if warm else "TPE suggestion"
            return Proposal(levers=layout.levers(), rationale=why + self.gate.note(layout.levers()))
        self.stop_reason = "no moves left: the sampler found no untried valid layout"
        return None


@dataclass
class EstimatorTopK:
    """Rank the whole space with the public estimator once; measure in predicted order, keep the best.
    Gated (the default): the planner knows the gate as attune does (see the module docstring)."""
    name: str = "estimator-topk"
    seed: int = 0
    stop_reason: str = ""
    k: int | None = None   # None: as many as the budget allows
    gated: bool = True
    max_too_dear: int = 300
    max_skipped: int = 5000   # layouts the gate rules may skip in one proposal (a config check is ~10 ms)
    _ranked: Any = None
    _next: int = 0
    _proposed: list[tuple] = field(default_factory=list)
    gate: GateRules = field(default_factory=GateRules)

    def propose(self, view: PlannerView) -> Proposal | None:
        if self._ranked is None:
            self._ranked = rank_by_estimator(view.recipe, MEMORY_HEADROOM if self.gated else 0.0)
        self.gate.see(view, probing=self.gated)
        tried = {layout_key(levers) for levers in _tried(view)}
        measured = sum(1 for key in self._proposed if key in tried)
        if self.k is not None and measured >= self.k:
            self.stop_reason = f"converged: measured the estimator's top {self.k}"
            return None
        too_dear = skipped = 0
        while self._next < len(self._ranked):
            rank, levers = self._next, self._ranked[self._next]
            self._next += 1
            if layout_key(levers) in tried:
                continue
            if self.gated and not gate_allows(self.gate, view.recipe, levers):
                skipped += 1
                if skipped >= self.max_skipped:   # the ranking is not exhausted: say how far it got
                    self.stop_reason = (f"stopped looking after {skipped:,} layouts the gate would refuse since "
                                        f"the last proposal; {self._next:,} of {len(self._ranked):,} ranked "
                                        f"layouts examined")
                    return None
                continue
            if _affordable(view, levers):
                self._proposed.append(layout_key(levers))
                return Proposal(levers=levers, rationale=f"estimator rank {rank + 1}{self.gate.note(levers)}")
            too_dear += 1
            if too_dear >= self.max_too_dear:
                self.stop_reason = (f"budget: the {self.max_too_dear} next best-predicted layouts cost more "
                                    f"than the budget left")
                return None
        self.stop_reason = "no moves left: every layout predicted to fit was measured or is one the gate would refuse"
        return None


def gate_allows(gate: GateRules, recipe: Recipe, levers: dict[str, Scalar]) -> bool:
    """The config check passes it and, in the numerics tier (float8), the gate's probe passed it."""
    if not gate.allows(recipe, levers):
        return False
    return not gate.tier(recipe, levers)[1] or gate.numerics_pass(levers)


def rank_by_estimator(recipe: Recipe, headroom: float = 0.0):
    """Every valid layout predicted to fit (leaving `headroom` of memory free), best predicted
    throughput first (a lazy sequence)."""
    from attune.planners.estimates import rank_layouts
    return rank_layouts(recipe, headroom=headroom)


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
    # a recipe's [search] may leave out the grid's fixed picks: keep what the space has, else its first value
    axes = {k: [v for v in values if v in d[k]] or d[k][:1] for k, values in axes.items()}
    out = []
    for values in itertools.product(*axes.values()):
        layout = _resolve(view.recipe, dict(zip(axes, values)))
        if layout is not None and layout.levers() not in out:
            out.append(layout.levers())
    return out


for _cls in (RandomPlanner, BayesPlanner, EstimatorTopK, GridPlanner):
    register_planner(_cls.name, lambda seed=0, _cls=_cls, **_: _cls(seed=seed))
register_planner("estimator-topk-naive", lambda seed=0, **_: EstimatorTopK(name="estimator-topk-naive", seed=seed,
                                                                            gated=False))
register_planner("bayes-warm", lambda seed=0, **_: BayesPlanner(name="bayes-warm", seed=seed, warm_start=WARM_START,
                                                                gated=True))
