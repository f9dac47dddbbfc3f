"""The `attune` planner: diagnose the incumbent, match lessons, move ONE lever, measure.

Search rules (each can be switched off for ablations, see RULES):
  cluster-fit      every prediction below is the public estimator's step model fitted to what the
                   trials measured (attune.planners.cluster_fit: compute per precision, each link's
                   bandwidth, how much communication hides, bubbles, recomputation, memory), and the
                   goal is re-ranked after every trial: where the cluster departs from the model, the
                   walk heads for what the cluster is, not for what the model says
  explore          the model's out-of-sample misses on this campaign's own trials (its doubt, shrunk
                   toward a 10% prior) widen what is worth a trial: a move predicted to gain more than
                   the floor minus the doubt is measured while the budget lasts. Where the model keeps
                   proving right the walk stops sooner; where it proves wrong it keeps measuring
  regoal           after a trial, a re-ranked goal not yet measured that is predicted to beat every
                   one-lever move by more than the floor is measured as it is
  oom-recompute    an out-of-memory layout is retried with the catalog's oom-recompute lesson (more
                   recomputation) before it is abandoned
  estimator-fit    candidates the model predicts not to fit are offered with the
                   recomputation or micro-batch compensation that makes them fit, else dropped
  no-repeat        a layout already measured (won or lost) is never proposed again
  cheaper-ties     among candidates predicted within TIE of each other the cheaper trial goes first
  lessons          lessons matching the diagnosis get their prior added to the model's gain;
                   without it every one-lever move is ranked by the model alone
  gate-safe        a candidate the gate's public config check would refuse (an objective change
                   or a known stack defect of gate/defects.toml) is offered with the compensation
                   that avoids it (no recomputation for the compile + recompute MoE defect), else
                   dropped: a campaign ships only what passes the gate, so such a trial is wasted
  estimator-goal   the model's best layout the gate rules allow (attune.planners.goal), predicted to leave
                   MEMORY_HEADROOM of memory free, is the search's goal:
                   among the moves predicted to improve, one that brings levers in line with the
                   goal is credited with a share of the goal's remaining predicted gain, so the
                   one-lever walk heads for the model's optimum instead of the nearest hill
  goal-jump        when no one-lever move is left worth a trial (in either tier), the
                   goal is measured as it is if it is predicted better than the incumbent: a local
                   optimum of one-lever moves (TP down needs CP up to fit) is left in one step
  recheck          a trial the model predicted to clear the noise band that measured a gain
                   inside it is measured once more before it is judged: one noisy run should not
                   send the walk down another path (the incumbent rule compares means, so two
                   runs need a smaller margin than one; attune.campaign.noise.clears_band)
  gate-probe       a move that puts the candidate in the gate's numerics tier (float8: the config
                   check passes it on to the convergence check on the proxy) is proposed only after
                   the whole gate has passed it (PlannerView.gate_probe: the proxy trains on the CPU,
                   no GPU-hours are spent). The proxy passes float8 on some recipes and layouts and
                   refuses it on others; a probed layout is gated at the end with the same verdict,
                   so float8 can be part of the walk from its first move. At most PROBE_LIMIT probes
  exact-first      without a probe (none offered, switched off or used up): no numerics-tier move
                   until the walk without one has converged; then float8 moves are tried from the
                   incumbent. A refused candidate falls back on the best one without a numerics
                   change (the campaign's fall_back), so the exact-tier gain is found first and never
                   staked on an unprobed float8 verdict
  goal-first       the first trial after the baseline is the goal (estimator-goal; a numerics-tier
                   goal only if the probe passes it; with cluster-fit ranked by the model fitted to
                   the baseline's breakdown) when it is predicted to gain more than the stopping
                   floor: the walk then refines it. The model ranks layouts better than it predicts
                   them, so its best layout is a better start than the public recipe; if it measures
                   worse, the walk starts from the baseline as without the rule, one trial later
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attune.errors import InputError
from attune.layout import AC_MODE, LOCAL_BATCH, PP_MICROBATCH, PP_SCHEDULE, Layout, apply_levers, resolve_layout
from attune.campaign.budget import hours_text
from attune.levers import Scalar, layout_key, levers_text
from attune.planners.gate_rules import GateRules
from attune.planners.base import Observation, PlannerView, Proposal
from attune.planners.cluster_fit import ClusterFit, ClusterModel
from attune.planners.goal import Goal, predicted_gain
from attune.space import config_for, layout_of
from attune.lessons.catalog import Lesson, load_lessons, match

RULES = ("cluster-fit", "explore", "regoal", "oom-recompute", "estimator-fit", "no-repeat", "cheaper-ties", "lessons", "gate-safe", "gate-probe",
         "exact-first", "estimator-goal", "goal-first", "goal-jump", "recheck")
TIE = 0.005            # predicted gains closer than this are a tie
PIPELINE_ONLY = (PP_SCHEDULE, PP_MICROBATCH)
OOM_LESSON = "oom-recompute"  # the lesson rule oom-recompute applies to a layout that ran out of memory
LESSON_WEIGHT = 0.5    # how much a matching lesson's prior adds to the estimator's predicted gain


@dataclass
class Candidate:
    levers: dict[str, Scalar]
    move: dict[str, Scalar]
    predicted_gain: float
    cost: float
    lesson: Lesson | None = None
    note: str = ""
    goal_credit: float = 0.0
    numerics: bool = False     # in the gate's numerics tier (float8)

    @property
    def score(self) -> float:
        return self.predicted_gain + (LESSON_WEIGHT * self.lesson.prior if self.lesson else 0.0)

    @property
    def rank(self) -> float:
        return self.score + self.goal_credit


@dataclass
class LessonGuidedPlanner:
    """See the module docstring. `stop_reason` says why propose() returned None."""

    name: str = "attune"
    disabled: frozenset[str] = frozenset()
    lessons: list[Lesson] = field(default_factory=load_lessons)
    min_gain: float | None = None   # stop when nothing is predicted to gain more (default: half the band)
    stop_reason: str = ""
    _too_dear: int = 0              # moves predicted to gain that the budget could not pay (this proposal)
    gate: GateRules = field(init=False)   # what the planner knows of the gate (attune.planners.gate_rules)
    goal: Goal = field(init=False)        # the model's best layout and its rules (attune.planners.goal)
    model: ClusterModel = field(init=False)   # the cluster as the trials show it (attune.planners.cluster_fit)

    def __post_init__(self):
        self.gate = GateRules(disabled=self.disabled)
        self.goal = Goal(gate=self.gate, rerank="cluster-fit" not in self.disabled)
        self.model = ClusterModel(fitted="cluster-fit" not in self.disabled)

    @property
    def fit(self) -> ClusterFit:
        return self.model.fit

    def propose(self, view: PlannerView) -> Proposal | None:
        recipe = view.recipe
        self.model.update(recipe, view.history)
        tried = [obs.levers for obs in view.history]
        last = view.history[-1] if view.history else None
        if last is not None and "oom-recompute" not in self.disabled:
            retry = self._recompute_retry(view, last, tried)
            if retry is not None:
                return retry
        if last is not None and "recheck" not in self.disabled:
            again = self._recheck(view, last)
            if again is not None:
                return again
        self.gate.see(view, probing="gate-probe" not in self.disabled)
        incumbent = layout_of(recipe, view.incumbent)
        floor = self.min_gain if self.min_gain is not None else view.noise_band / 2
        only_baseline = all(levers == tried[0] for levers in tried)
        if "goal-first" not in self.disabled and only_baseline:
            first = self.goal.first(view, self.fit, incumbent, floor)
            if first is not None:
                return first
        symptoms = self._incumbent_symptoms(view)
        self._too_dear = 0   # counted over both rankings below, so the stop reason names the budget
        doubt = self.model.doubt if "explore" not in self.disabled else 0.0
        pick = self._pick(view, incumbent, self._worthwhile(view, incumbent, symptoms, tried, floor, doubt))
        exact_first = self.gate.probe is None and "exact-first" not in self.disabled
        if pick is None and exact_first and not self.gate.numerics_open:
            self.gate.numerics_open = True   # the exact-tier walk has converged: now float8 may be tried
            pick = self._pick(view, incumbent, self._worthwhile(view, incumbent, symptoms, tried, floor, doubt))
        if "regoal" not in self.disabled and not only_baseline:
            best_move = pick.predicted_gain if pick is not None else floor
            again = self.goal.regoal(view, self.fit, incumbent, tried, floor, best_move)
            if again is not None:
                return again
        if pick is None:
            if "goal-jump" in self.disabled:
                return None
            proposal, self.stop_reason = self.goal.jump_when_stuck(view, self.fit, incumbent, tried, floor,
                                                                   self.stop_reason)
            return proposal
        why = (f"lesson {pick.lesson.id}: {pick.lesson.title}" if pick.lesson else "model-ranked one-lever move")
        if pick.goal_credit > 0:
            why += f" toward the goal (+{pick.goal_credit:.1%} credit)"
        corrections = self.fit.summary()
        fitted = f" (fitted: {corrections})" if corrections else ""
        explored = (f"; explored: within the model's measured error ({doubt:.1%}) of a gain"
                    if pick.score <= floor else "")
        return Proposal(levers=pick.levers, move=pick.move, lesson_id=pick.lesson.id if pick.lesson else None,
                        expected_gain=pick.predicted_gain,
                        rationale=f"{why}; symptoms {sorted(symptoms) or ['none']}; the model{fitted} predicts "
                                  f"{pick.predicted_gain:+.1%}{pick.note}{explored}{self.gate.note(pick.levers)}")

    def _pick(self, view: PlannerView, incumbent: Layout, candidates: list[Candidate]) -> Candidate | None:
        """The best-ranked candidate (the cheapest of a tie); a numerics-tier one only once the gate
        has passed it (gate-probe): a refused one is dropped and the next is taken."""
        if candidates and "estimator-goal" not in self.disabled and not self.gate.numerics_open:
            self.goal.credit(view, self.fit, incumbent, candidates)
        while candidates:
            best_rank = max(c.rank for c in candidates)
            if "cheaper-ties" in self.disabled:
                pick = max(candidates, key=lambda c: c.rank)
            else:
                pick = min((c for c in candidates if c.rank >= best_rank - TIE), key=lambda c: (c.cost, -c.rank))
            if not pick.numerics or self.gate.numerics_pass(pick.levers):
                return pick
            candidates.remove(pick)
            self.stop_reason = ("no moves left: the gate refused every numerics-tier candidate predicted to gain "
                                "when probed on the proxy, and no other move is worth a trial")
        return None

    # ------------------------------------------------------------------------------------------
    def _worthwhile(self, view: PlannerView, incumbent: Layout, symptoms: set[str], tried: list,
                    floor: float, doubt: float = 0.0) -> list[Candidate]:
        """Candidates predicted to gain more than `floor` less the model's `doubt`; if none,
        stop_reason says why."""
        candidates = self._candidates(view, incumbent, symptoms, tried)
        worthwhile = [c for c in candidates if c.score > floor - doubt]
        if worthwhile:
            return worthwhile
        if self._too_dear:
            self.stop_reason = (f"budget spent: {self._too_dear} untried one-lever move(s) predicted to gain cost "
                                f"more than the {hours_text(view.budget_left_gpu_hours)} GPU-hours left can pay with "
                                f"their confirmation")
        elif not candidates:
            self.stop_reason = ("no moves left: every one-lever move from the incumbent was measured, is "
                                "predicted not to fit, or is one the gate would refuse")
        else:
            within = f" less the model's measured error ({doubt:.1%})" if doubt else ""
            self.stop_reason = (f"converged: no untried one-lever move is predicted to gain more than "
                                f"{floor:.1%}{within} over the incumbent")
        return []

    def _recompute_retry(self, view: PlannerView, last: Observation, tried: list) -> Proposal | None:
        """oom-recompute: the catalog's lesson of that name applied to the layout that ran out of
        memory (not to the incumbent, whose trial ran), before that layout is abandoned."""
        lesson = next((item for item in self.lessons if item.id == OOM_LESSON), None)
        if last.result.status.value != "oom" or lesson is None:
            return None
        recipe = view.recipe
        layout = layout_of(recipe, last.levers, check=False)
        if not lesson.applies({"oom"}, recipe.architecture.is_moe, layout):
            return None
        move = lesson.move(layout, view.domains[lesson.try_.lever])
        moved = dict(last.levers) | (move or {})
        if not move or moved in tried or not self.gate.allows(recipe, moved):
            return None
        if self.gate.tier(recipe, moved)[1] and not self.gate.numerics_pass(moved):
            return None
        return Proposal(levers=moved, move=move, lesson_id=lesson.id,
                        rationale=f"rule oom-recompute: the last layout ran out of memory; lesson {lesson.id}: "
                                  f"{lesson.title} ({levers_text(move)})")

    def _recheck(self, view: PlannerView, last: Observation) -> Proposal | None:
        """The last trial once more, if it measured a gain inside the band the estimator expected it to clear."""
        if not last.result.ok or last.levers == view.incumbent or last.levers == view.history[0].levers:
            return None
        if sum(1 for obs in view.history if obs.levers == last.levers and obs.result.ok) != 1 or not view.incumbent_tps:
            return None
        measured = last.result.tokens_per_sec_per_gpu / view.incumbent_tps - 1
        recipe = view.recipe
        here = layout_of(recipe, view.incumbent)
        expected = predicted_gain(self.fit, recipe, here, last.levers)
        if measured <= 0 or expected < view.noise_band:
            return None
        if view.affordable is not None and not view.affordable(last.levers):
            return None
        return Proposal(levers=dict(last.levers), move=None, expected_gain=expected,
                        rationale=f"rule recheck: measured {measured:+.1%} over the incumbent, inside the noise "
                                  f"band, where the estimator predicts {expected:+.1%}: measured once more")

    def _incumbent_symptoms(self, view: PlannerView) -> set[str]:
        for obs in reversed(view.history):
            if obs.levers == view.incumbent:
                return set(obs.diagnosis)
        return set()

    def _candidates(self, view: PlannerView, incumbent: Layout, symptoms: set[str], tried: list) -> list[Candidate]:
        recipe = view.recipe
        base_pred = self.fit.predict(recipe, incumbent)
        lessons = [] if "lessons" in self.disabled else match(self.lessons, symptoms, recipe.architecture.is_moe,
                                                              incumbent)
        moves: list[tuple[dict[str, Scalar], Lesson | None]] = []
        for lesson in lessons:
            move = lesson.move(incumbent, view.domains[lesson.try_.lever])
            if move:
                moves.append((move, lesson))
        inert = PIPELINE_ONLY if incumbent.pp == 1 else ()   # without a pipeline these change nothing
        for key, values in view.domains.items():   # every other one-lever move, ranked by the model
            for value in values:
                if incumbent.levers()[key] != value and key not in inert:
                    moves.append(({key: value}, None))
        seen: dict[tuple, Candidate] = {}
        for move, lesson in moves:
            cand = self._evaluate(view, incumbent, base_pred.tokens_per_sec_per_gpu, move, lesson, tried)
            if cand is None:
                continue
            key = layout_key(cand.levers)
            if key not in seen or cand.score > seen[key].score:
                seen[key] = cand
        return list(seen.values())

    def _compensations(self, view: PlannerView, incumbent: Layout, move: dict[str, Scalar]) -> list[tuple[dict, str]]:
        """The move as it is, then with the compensation it may force: more recomputation or a
        smaller micro-batch to fit memory (estimator-fit), no recomputation where recomputing would
        hit a known defect (gate-safe), or both an AC mode and a micro-batch."""
        fit, safe = "estimator-fit" not in self.disabled, "gate-safe" not in self.disabled
        modes = []
        if AC_MODE not in move:
            modes = [m for m in (["selective", "full"] if fit else []) + (["none"] if safe else [])
                     if m != incumbent.ac_mode and m in view.domains[AC_MODE]]   # the recipe's [search] holds
        batches = [v for v in sorted(view.domains[LOCAL_BATCH]) if v < incumbent.local_batch] \
            if fit and LOCAL_BATCH not in move else []
        out = [(move, "")]
        out += [(move | {AC_MODE: m}, f" with {m} recomputation") for m in modes]
        out += [(move | {LOCAL_BATCH: b}, f" with micro-batch {b} to fit") for b in batches]
        out += [(move | {AC_MODE: m, LOCAL_BATCH: b}, f" with {m} recomputation and micro-batch {b}")
                for m in modes for b in batches]
        return out

    def _evaluate(self, view: PlannerView, incumbent: Layout, base_tps: float, move: dict[str, Scalar],
                  lesson: Lesson | None, tried: list) -> Candidate | None:
        """The move if it is feasible as it is (fits, the gate would take it), else its best-predicted
        feasible compensation, else None."""
        recipe = view.recipe
        model, cluster = recipe.architecture, recipe.cluster
        best = None
        for i, (levers_move, note) in enumerate(self._compensations(view, incumbent, move)):
            try:
                config = apply_levers(config_for(recipe, view.incumbent), levers_move, model, cluster)
                layout = resolve_layout(config, model, cluster)
            except InputError:
                continue
            levers = layout.levers()
            if "no-repeat" not in self.disabled and levers in tried:
                if i == 0:
                    return None
                continue
            if not self.gate.allows(recipe, levers):
                continue
            pred = self.fit.predict(recipe, layout)
            if not pred.fits and "estimator-fit" not in self.disabled:
                continue
            if best is None or pred.tokens_per_sec_per_gpu > best[0].tokens_per_sec_per_gpu:
                best = (pred, levers, levers_move, note)
            if i == 0:
                break   # feasible as it is: no compensation is forced
        if best is None:
            return None
        pred, levers, levers_move, note = best
        if view.affordable is not None and not view.affordable(levers):
            self._too_dear += pred.tokens_per_sec_per_gpu > base_tps   # only moves that would have been worth it
            return None   # the budget cannot pay for it: proposing it would end the search
        cost = view.trial_cost_gpu_hours(levers) if view.trial_cost_gpu_hours else pred.step_time_s
        return Candidate(levers=levers, move=levers_move, predicted_gain=pred.tokens_per_sec_per_gpu / base_tps - 1,
                         cost=cost, lesson=lesson, note=note, numerics=self.gate.tier(recipe, levers)[1])


