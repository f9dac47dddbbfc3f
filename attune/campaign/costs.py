"""What a run will cost, learned like step times: the stack's estimate is the prior, this campaign's
runs correct it.

A run's wall time is a fixed part (launch, start-up, compilation, warm-up steps) and a part per
measured step. A stack's estimate_wall_time_s(recipe, steps) is linear in the steps, so two calls
separate its two parts; a finished run shows both too (its wall time, its step time, its steps).

  a layout already measured   its own fixed part and step time, at the steps asked (REPEAT_MARGIN on top):
                              a confirmation of a layout screened at half the steps is priced at its
                              full length from what the screening run measured
  a layout not yet measured   the stack's prior, each part scaled by how far the prior was off on the
                              runs measured so far: the fixed part by the ratio of runs with the same
                              compile setting (compilation is what start-ups differ by most; the other
                              setting's ratio until one is measured), the step part by the ratio over
                              all runs. The largest ratio seen is used: a budget must not be overrun

So a prior that is wrong by 100x (compile's start-up on a CPU) stops pricing every layout after the
first run of its kind, and one that is too low raises every estimate after the first run. Nothing
here is stored apart from the campaign's trials: a resumed campaign learns the same.

A warm-started campaign (attune.campaign.warm_start) also learns the start-up ratios of the earlier
campaign's runs (`earlier`): before its first compiled run, a compiled layout is priced at the
start-up compiled runs took there, not at the prior. Their step times are not carried: the change
that made the re-tune may be exactly what moved them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from attune.levers import layout_key
from attune.recipe import Recipe

REPEAT_MARGIN = 1.10   # a layout measured before costs what it measured, with this margin (start-ups vary)
PROBE_STEPS = 10       # the second step count the prior is asked at, to separate its two parts


@dataclass(frozen=True)
class MeasuredRun:
    levers: dict[str, Any]
    steps: int                 # measured steps it was asked for (0 for a run that ended before any)
    wall_time_s: float
    step_time_s: float         # 0 for a run that ended before a measured step (out of memory)


@dataclass
class TrialCosts:
    """`prior(recipe, steps)`: the stack's estimate of a run's wall time in seconds; `recipe`: the
    campaign's recipe (a measured run's layout is priced on it)."""

    prior: Callable[[Recipe, int], float]
    recipe: Recipe
    _own: dict[tuple, tuple[float, float]] = field(default_factory=dict)       # layout -> fixed s, step s
    _fixed_ratios: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})
    _step_ratios: list[float] = field(default_factory=list)
    runs_seen: list[MeasuredRun] = field(default_factory=list)
    _learned: int = -1
    _parts: dict[tuple, tuple[float, float]] = field(default_factory=dict)   # the prior's, per layout and steps

    def learn(self, runs: Sequence[MeasuredRun], earlier: Sequence[MeasuredRun] = ()) -> None:
        """What the campaign's runs measured (cheap when nothing new came in): a successful run both
        parts, an out-of-memory one (step_time_s 0: it ended after its first step) its start-up;
        `earlier` runs (a warm start's) their start-up only."""
        runs = [r for r in runs if r.wall_time_s > 0]
        if len(runs) == self._learned:
            return
        self._learned, self.runs_seen, own = len(runs), runs, {}
        self._fixed_ratios, self._step_ratios = {True: [], False: []}, []
        for r in earlier:
            if r.wall_time_s > 0:
                self._learn_start_up(r)
        for r in runs:
            fixed, prior_step = self._learn_start_up(r)
            if r.step_time_s > 0:
                own.setdefault(layout_key(r.levers), []).append((fixed, r.step_time_s))
                if prior_step > 0:
                    self._step_ratios.append(r.step_time_s / prior_step)
        self._own = {k: (sum(f for f, _ in v) / len(v), sum(s for _, s in v) / len(v)) for k, v in own.items()}

    def _learn_start_up(self, r: MeasuredRun) -> tuple[float, float]:
        """Keep the run's fixed part against the prior's (by compile setting); (its fixed seconds, the
        prior's seconds per step)."""
        from attune.space import recipe_at

        fixed = max(0.0, r.wall_time_s - r.steps * r.step_time_s)
        prior_fixed, prior_step = self.parts(recipe_at(self.recipe, r.levers), r.steps)
        if prior_fixed > 0:
            self._fixed_ratios[_compiled(r.levers)].append(fixed / prior_fixed)
        return fixed, prior_step

    def parts(self, recipe: Recipe, steps: int) -> tuple[float, float]:
        """The prior's (fixed seconds, seconds per measured step) for this recipe (memoised: a
        planner prices thousands of layouts again after every run, and the prior never moves)."""
        key = (layout_key(recipe.layout().levers()), steps)
        if key not in self._parts:
            at = self.prior(recipe, steps)
            per_step = max(0.0, (self.prior(recipe, steps + PROBE_STEPS) - at) / PROBE_STEPS)
            self._parts[key] = (max(0.0, at - steps * per_step), per_step)
        return self._parts[key]

    def wall_time_s(self, recipe: Recipe, steps: int) -> float:
        """The run's expected wall time in seconds (see the module docstring)."""
        levers = recipe.layout().levers()
        own = self._own.get(layout_key(levers))
        if own is not None:
            return REPEAT_MARGIN * (own[0] + steps * own[1])
        fixed, per_step = self.parts(recipe, steps)
        return fixed * self.fixed_ratio(_compiled(levers)) + steps * per_step * self.step_ratio()

    def fixed_ratio(self, compiled: bool) -> float:
        """Measured / prior fixed part: the largest over runs of the same compile setting (else of
        the other); 1 before any run."""
        same = self._fixed_ratios[compiled] or self._fixed_ratios[not compiled]
        return max(same) if same else 1.0

    def step_ratio(self) -> float:
        return max(self._step_ratios) if self._step_ratios else 1.0


def _compiled(levers: dict[str, Any]) -> bool:
    return bool(levers.get("compile.enable"))
