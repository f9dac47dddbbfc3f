"""The `attune` planner: diagnose the incumbent, match lessons, move ONE lever, measure.

Search rules (each can be switched off for ablations, see RULES):
  oom-recompute    an out-of-memory layout is retried with more recomputation before it is abandoned
  estimator-fit    candidates the public estimator predicts not to fit are offered with the
                   recomputation or micro-batch compensation that makes them fit, else dropped
  no-repeat        a layout already measured (won or lost) is never proposed again
  cheaper-ties     among candidates predicted within TIE of each other the cheaper trial goes first
  lessons          lessons matching the diagnosis get their prior added to the estimator's gain;
                   without it every one-lever move is ranked by the estimator alone
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attune.errors import InputError
from attune.layout import AC_MODE, LOCAL_BATCH, Layout, apply_levers, resolve_layout
from attune.levers import Scalar
from attune.planners.base import Observation, PlannerView, Proposal
from attune.planners.estimates import predict
from attune.space import config_for
from lessons.catalog import Lesson, load_lessons, match

RULES = ("oom-recompute", "estimator-fit", "no-repeat", "cheaper-ties", "lessons")
TIE = 0.005            # predicted gains closer than this are a tie
LESSON_WEIGHT = 0.5    # how much a matching lesson's prior adds to the estimator's predicted gain


@dataclass
class Candidate:
    levers: dict[str, Scalar]
    move: dict[str, Scalar]
    predicted_gain: float
    cost: float
    lesson: Lesson | None = None
    note: str = ""

    @property
    def score(self) -> float:
        return self.predicted_gain + (LESSON_WEIGHT * self.lesson.prior if self.lesson else 0.0)


@dataclass
class LessonGuidedPlanner:
    """See the module docstring. `stop_reason` says why propose() returned None."""

    name: str = "attune"
    disabled: frozenset[str] = frozenset()
    lessons: list[Lesson] = field(default_factory=load_lessons)
    min_gain: float | None = None   # stop when nothing is predicted to gain more (default: half the band)
    stop_reason: str = ""

    def propose(self, view: PlannerView) -> Proposal | None:
        recipe = view.recipe
        tried = [obs.levers for obs in view.history]
        last = view.history[-1] if view.history else None
        if last is not None and "oom-recompute" not in self.disabled:
            retry = self._recompute_retry(view, last, tried)
            if retry is not None:
                return retry
        incumbent = resolve_layout(config_for(recipe, view.incumbent), recipe.architecture, recipe.cluster)
        symptoms = self._incumbent_symptoms(view)
        candidates = self._candidates(view, incumbent, symptoms, tried)
        if not candidates:
            self.stop_reason = "no moves left: every valid one-lever move from the incumbent was measured"
            return None
        floor = self.min_gain if self.min_gain is not None else view.noise_band / 2
        candidates = [c for c in candidates if c.score > floor]
        if not candidates:
            self.stop_reason = (f"converged: no untried one-lever move is predicted to gain more than "
                                f"{floor:.1%} over the incumbent")
            return None
        best_score = max(c.score for c in candidates)
        if "cheaper-ties" in self.disabled:
            pick = max(candidates, key=lambda c: c.score)
        else:
            pick = min((c for c in candidates if c.score >= best_score - TIE), key=lambda c: (c.cost, -c.score))
        why = (f"lesson {pick.lesson.id}: {pick.lesson.title}" if pick.lesson else "estimator-ranked one-lever move")
        return Proposal(levers=pick.levers, move=pick.move, lesson_id=pick.lesson.id if pick.lesson else None,
                        expected_gain=pick.predicted_gain,
                        rationale=f"{why}; symptoms {sorted(symptoms) or ['none']}; estimator predicts "
                                  f"{pick.predicted_gain:+.1%}{pick.note}")

    # ------------------------------------------------------------------------------------------
    def _recompute_retry(self, view: PlannerView, last: Observation, tried: list) -> Proposal | None:
        if last.result.status.value != "oom":
            return None
        recipe = view.recipe
        layout = resolve_layout(config_for(recipe, last.levers), recipe.architecture, recipe.cluster, check=False)
        order = ["none", "selective", "full"]
        if layout.ac_mode == "full":
            return None
        moved = dict(last.levers) | {AC_MODE: order[order.index(layout.ac_mode) + 1]}
        if moved in tried:
            return None
        return Proposal(levers=moved, move={AC_MODE: moved[AC_MODE]}, lesson_id="oom-recompute",
                        rationale=f"rule oom-recompute: the last layout ran out of memory; retried with "
                                  f"{moved[AC_MODE]} recomputation before abandoning it")

    def _incumbent_symptoms(self, view: PlannerView) -> set[str]:
        for obs in reversed(view.history):
            if obs.levers == view.incumbent:
                return set(obs.diagnosis)
        return set()

    def _candidates(self, view: PlannerView, incumbent: Layout, symptoms: set[str], tried: list) -> list[Candidate]:
        recipe = view.recipe
        base_pred = predict(recipe, incumbent)
        lessons = [] if "lessons" in self.disabled else match(self.lessons, symptoms, recipe.architecture.is_moe,
                                                              incumbent)
        moves: list[tuple[dict[str, Scalar], Lesson | None]] = []
        for lesson in lessons:
            move = lesson.move(incumbent, view.domains[lesson.try_.lever])
            if move:
                moves.append((move, lesson))
        for key, values in view.domains.items():   # every other one-lever move, ranked by the estimator
            for value in values:
                if incumbent.levers()[key] != value:
                    moves.append(({key: value}, None))
        seen: dict[tuple, Candidate] = {}
        for move, lesson in moves:
            cand = self._evaluate(view, incumbent, base_pred.tokens_per_sec_per_gpu, move, lesson, tried)
            if cand is None:
                continue
            key = tuple(sorted(cand.levers.items()))
            if key not in seen or cand.score > seen[key].score:
                seen[key] = cand
        return list(seen.values())

    def _evaluate(self, view: PlannerView, incumbent: Layout, base_tps: float, move: dict[str, Scalar],
                  lesson: Lesson | None, tried: list) -> Candidate | None:
        recipe = view.recipe
        model, cluster = recipe.architecture, recipe.cluster
        attempts = [(move, "")]
        if "estimator-fit" not in self.disabled:
            attempts += [(move | {AC_MODE: "full"}, " with full recomputation to fit"),
                         (move | {LOCAL_BATCH: 1}, " with micro-batch 1 to fit")]
        for levers_move, note in attempts:
            try:
                config = apply_levers(config_for(recipe, view.incumbent), levers_move, model, cluster)
                layout = resolve_layout(config, model, cluster)
            except InputError:
                continue
            levers = layout.levers()
            if "no-repeat" not in self.disabled and levers in tried:
                return None
            pred = predict(recipe, layout)
            if not pred.fits and "estimator-fit" not in self.disabled:
                continue
            cost = view.trial_cost_gpu_hours(levers) if view.trial_cost_gpu_hours else pred.step_time_s
            return Candidate(levers=levers, move=levers_move, predicted_gain=pred.tokens_per_sec_per_gpu / base_tps - 1,
                             cost=cost, lesson=lesson, note=note)
        return None
