"""The `attune` planner's goal: the best layout its model of the cluster predicts, and the rules that use it.

The goal is the best-predicted layout of the whole lever space that the gate rules allow and that is
predicted to leave MEMORY_HEADROOM of memory free; with rule cluster-fit the prediction is the public
estimator fitted to what the trials measured (attune.planners.cluster_fit), and the goal is re-ranked
after every trial. Rules (attune.planners.lesson_guided explains each):

  estimator-goal   one-lever moves that bring levers in line with the goal get credit
  goal-first       the first trial after the baseline is the goal
  regoal           after a trial, a re-ranked goal predicted better than any one-lever move is measured
  goal-jump        when no one-lever move is left worth a trial, the goal is measured as it is
"""

from __future__ import annotations

from dataclasses import dataclass

from attune.campaign.budget import hours_text
from attune.layout import FLOAT8, Layout
from attune.levers import Scalar
from attune.planners.base import PlannerView, Proposal
from attune.planners.cluster_fit import ClusterFit
from attune.planners.estimates import MEMORY_HEADROOM
from attune.planners.gate_rules import GateRules
from attune.recipe import Recipe
from attune.space import layout_of

GOAL_WEIGHT = 0.5      # share of the goal's remaining predicted gain credited per lever brought in line
GOAL_SCAN = 20_000     # model-ranked layouts scanned for the goal (the gate rules decide the first)
GOAL_CHECKS = 500      # config checks spent on it at most (about 10 ms each)


def predicted_gain(fit: ClusterFit, recipe: Recipe, incumbent: Layout, levers: dict[str, Scalar]) -> float:
    """The model's relative gain of these levers over the incumbent."""
    there = fit.predict(recipe, layout_of(recipe, levers))
    return there.tokens_per_sec_per_gpu / fit.predict(recipe, incumbent).tokens_per_sec_per_gpu - 1


def jump(incumbent: Layout, goal: dict[str, Scalar], gain: float, why) -> Proposal:
    """The goal measured as it is; why(n) is the rationale, n the number of levers it moves."""
    moved = {k: v for k, v in goal.items() if incumbent.levers()[k] != v}
    return Proposal(levers=dict(goal), move=moved, expected_gain=gain, rationale=why(len(moved)))


@dataclass
class Goal:
    gate: GateRules
    rerank: bool = True                  # cluster-fit: re-rank after every trial
    _levers: dict[str, Scalar] | None = None
    _ranked_for: int = -1                # the history length the goal was ranked for

    def levers(self, view: PlannerView, fit: ClusterFit) -> dict[str, Scalar] | None:
        """The model's best-predicted layout that passes the gate rules in force."""
        ranked_for = len(view.history) if self.rerank else 0
        if self._ranked_for != ranked_for:
            from attune.planners.estimates import rank_layouts

            self._ranked_for, self._levers = ranked_for, None
            ranked = rank_layouts(view.recipe, headroom=MEMORY_HEADROOM, fit=fit)
            float8 = view.recipe.layout().float8
            checks, probed = 0, False
            for i in range(min(len(ranked), GOAL_SCAN)):
                levers = ranked[i]
                if levers[FLOAT8] != float8 and (probed or not self.gate.numerics_allowed(levers)):
                    continue   # cheap: a float8 change always puts the candidate in the numerics tier
                if self.gate.allows(view.recipe, levers):
                    numerics = self.gate.tier(view.recipe, levers)[1]
                    probed = probed or numerics   # one probe for the goal: if refused, an exact-tier goal
                    if not numerics or self.gate.numerics_pass(levers):
                        self._levers = levers
                        break
                checks += 1
                if checks >= GOAL_CHECKS:
                    break
        return self._levers

    def credit(self, view: PlannerView, fit: ClusterFit, incumbent: Layout, candidates: list) -> None:
        """estimator-goal: credit each improving candidate with GOAL_WEIGHT x the goal's predicted gain
        over the incumbent x the share of the remaining distance (levers that differ) it closes."""
        goal = self.levers(view, fit)
        if goal is None:
            return
        here = incumbent.levers()
        distance = sum(here[k] != v for k, v in goal.items())
        if distance == 0:
            return
        ahead = predicted_gain(fit, view.recipe, incumbent, goal)
        if ahead <= 0:
            return
        for c in candidates:
            closer = sum((c.levers[k] == v) - (here[k] == v) for k, v in goal.items())
            c.goal_credit = GOAL_WEIGHT * ahead * max(0, closer) / distance

    def first(self, view: PlannerView, fit: ClusterFit, incumbent: Layout, floor: float) -> Proposal | None:
        """goal-first: only the baseline is measured; the goal is the first trial if it is predicted
        to gain more than `floor` and the budget pays for it."""
        goal = self.levers(view, fit)
        if goal is None or goal == view.incumbent:
            return None
        gain = predicted_gain(fit, view.recipe, incumbent, goal)
        if gain <= floor or (view.affordable is not None and not view.affordable(goal)):
            return None
        note = self.gate.note(goal)
        return jump(incumbent, goal, gain, lambda n: f"rule goal-first: the best layout the gate allows is {n} "
                                                     f"lever(s) from the baseline and predicted {gain:+.1%}: measured "
                                                     f"first, then refined one lever at a time{note}")

    def regoal(self, view: PlannerView, fit: ClusterFit, incumbent: Layout, tried: list, floor: float,
               best_move: float) -> Proposal | None:
        """regoal: what the trials measured moved the goal to a layout not yet tried, predicted to gain
        more than `floor` and more than the best one-lever move (`best_move`) by `floor` again."""
        goal = self.levers(view, fit)
        if goal is None or goal in tried or goal == view.incumbent:
            return None
        gain = predicted_gain(fit, view.recipe, incumbent, goal)
        if gain <= floor or gain <= best_move + floor:
            return None
        if view.affordable is not None and not view.affordable(goal):
            return None
        corrections = fit.summary() or "none"
        return jump(incumbent, goal, gain, lambda n: f"rule regoal: refitted to what the trials measured "
                                                     f"({corrections}), the best layout the gate allows is {n} "
                                                     f"lever(s) away and predicted {gain:+.1%}, more than any "
                                                     f"one-lever move ({best_move:+.1%}){self.gate.note(goal)}")

    def jump_when_stuck(self, view: PlannerView, fit: ClusterFit, incumbent: Layout, tried: list, floor: float,
                        stuck: str) -> tuple[Proposal | None, str]:
        """goal-jump: no one-lever move is left worth a trial (`stuck` says why), yet the goal is
        predicted better by more than `floor`. It is often two levers away (TP down and CP up: neither
        fits alone), so it is measured as it is, once. Returns the proposal and the stop reason."""
        goal = self.levers(view, fit)
        if goal is None or goal in tried or goal == view.incumbent:
            return None, stuck
        gain = predicted_gain(fit, view.recipe, incumbent, goal)
        if gain <= floor:
            return None, stuck
        if view.affordable is not None and not view.affordable(goal):
            return None, (f"budget spent: the best layout the gate allows, predicted {gain:+.1%} over the incumbent, "
                          f"costs more than the {hours_text(view.budget_left_gpu_hours)} GPU-hours left can pay "
                          f"with its confirmation ({stuck})")
        return jump(incumbent, goal, gain, lambda n: f"rule goal-jump: no one-lever move is left worth a trial "
                                                     f"({stuck}); the best layout the gate allows is {n} levers "
                                                     f"away and predicted {gain:+.1%}"), stuck
