"""The `attune` planner: diagnose the incumbent, match lessons, move ONE lever, measure.

Search rules (each can be switched off for ablations, see RULES):
  oom-recompute    an out-of-memory layout is retried with more recomputation before it is abandoned
  estimator-fit    candidates the public estimator predicts not to fit are offered with the
                   recomputation or micro-batch compensation that makes them fit, else dropped
  no-repeat        a layout already measured (won or lost) is never proposed again
  cheaper-ties     among candidates predicted within TIE of each other the cheaper trial goes first
  lessons          lessons matching the diagnosis get their prior added to the estimator's gain;
                   without it every one-lever move is ranked by the estimator alone
  gate-safe        a candidate the gate's public config check would refuse (an objective change
                   or a known stack defect of gate/defects.toml) is offered with the compensation
                   that avoids it (no recomputation for the compile + recompute MoE defect), else
                   dropped: a campaign ships only what passes the gate, so such a trial is wasted
  estimator-goal   the public estimator's best layout the gate rules allow, predicted to leave
                   GOAL_HEADROOM of memory free, is the search's goal:
                   among the moves predicted to improve, one that brings levers in line with the
                   goal is credited with a share of the goal's remaining predicted gain, so the
                   one-lever walk heads for the estimator's optimum instead of the nearest hill
  goal-jump        when no one-lever move is left worth a trial (in either tier), the estimator's
                   goal is measured as it is if it is predicted better than the incumbent: a local
                   optimum of one-lever moves (TP down needs CP up to fit) is left in one step
  recheck          a trial the estimator predicted to clear the noise band that measured a gain
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
  goal-first       the first trial after the baseline is the estimator's goal (estimator-goal; a
                   numerics-tier goal only if the probe passes it) when it is predicted to gain more
                   than the stopping floor: the walk then refines it one lever at a time. The public
                   estimator ranks layouts well and misses per-cluster effects, so its best layout is
                   a better start than the public recipe; if it measures worse, the walk starts from
                   the baseline as without the rule, one trial later
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attune.errors import InputError
from attune.layout import AC_MODE, FLOAT8, LOCAL_BATCH, Layout, apply_levers, resolve_layout
from attune.levers import Scalar
from attune.campaign.budget import hours_text
from attune.planners.gate_rules import GateRules
from attune.planners.base import Observation, PlannerView, Proposal
from attune.planners.estimates import predict
from attune.recipe import Recipe
from attune.space import config_for
from lessons.catalog import Lesson, load_lessons, match

RULES = ("oom-recompute", "estimator-fit", "no-repeat", "cheaper-ties", "lessons", "gate-safe", "gate-probe",
         "exact-first", "estimator-goal", "goal-first", "goal-jump", "recheck")
TIE = 0.005            # predicted gains closer than this are a tie
LESSON_WEIGHT = 0.5    # how much a matching lesson's prior adds to the estimator's predicted gain
GOAL_WEIGHT = 0.5      # share of the goal's remaining predicted gain credited per lever brought in line
GOAL_SCAN = 20_000     # estimator-ranked layouts scanned for the goal (the gate rules decide the first)
GOAL_CHECKS = 500      # config checks spent on it at most (about 10 ms each)
GOAL_HEADROOM = 0.10   # share of GPU memory the goal must be predicted to leave free: it is reached by a
                       # jump of several levers, and memory is what a cluster most often contradicts
                       # the estimator on (an OOM first trial costs a trial and its retry)


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
    _goal: dict[str, Scalar] | None = None
    _goal_done: bool = False
    _too_dear: int = 0              # moves predicted to gain that the budget could not pay (this proposal)
    gate: GateRules = field(init=False)   # what the planner knows of the gate (attune.planners.gate_rules)

    def __post_init__(self):
        self.gate = GateRules(disabled=self.disabled)

    def propose(self, view: PlannerView) -> Proposal | None:
        recipe = view.recipe
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
        self.gate.probe = view.gate_probe if "gate-probe" not in self.disabled else None
        incumbent = resolve_layout(config_for(recipe, view.incumbent), recipe.architecture, recipe.cluster)
        floor = self.min_gain if self.min_gain is not None else view.noise_band / 2
        if "goal-first" not in self.disabled and all(obs.levers == tried[0] for obs in view.history):
            first = self._goal_first(view, incumbent, floor)
            if first is not None:
                return first
        symptoms = self._incumbent_symptoms(view)
        self._too_dear = 0   # counted over both rankings below, so the stop reason names the budget
        pick = self._pick(view, incumbent, self._worthwhile(view, incumbent, symptoms, tried, floor))
        exact_first = self.gate.probe is None and "exact-first" not in self.disabled
        if pick is None and exact_first and not self.gate.numerics_open:
            self.gate.numerics_open = True   # the exact-tier walk has converged: now float8 may be tried
            pick = self._pick(view, incumbent, self._worthwhile(view, incumbent, symptoms, tried, floor))
        if pick is None:
            return self._goal_jump(view, incumbent, tried, floor) if "goal-jump" not in self.disabled else None
        why = (f"lesson {pick.lesson.id}: {pick.lesson.title}" if pick.lesson else "estimator-ranked one-lever move")
        if pick.goal_credit > 0:
            why += f" toward the estimator's goal (+{pick.goal_credit:.1%} credit)"
        return Proposal(levers=pick.levers, move=pick.move, lesson_id=pick.lesson.id if pick.lesson else None,
                        expected_gain=pick.predicted_gain,
                        rationale=f"{why}; symptoms {sorted(symptoms) or ['none']}; estimator predicts "
                                  f"{pick.predicted_gain:+.1%}{pick.note}{self.gate.note(pick.levers)}")

    def _pick(self, view: PlannerView, incumbent: Layout, candidates: list[Candidate]) -> Candidate | None:
        """The best-ranked candidate (the cheapest of a tie); a numerics-tier one only once the gate
        has passed it (gate-probe): a refused one is dropped and the next is taken."""
        if candidates and "estimator-goal" not in self.disabled and not self.gate.numerics_open:
            self._credit_goal(view, incumbent, candidates)
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
                    floor: float) -> list[Candidate]:
        """Candidates predicted to gain more than `floor`; if none, stop_reason says why."""
        candidates = self._candidates(view, incumbent, symptoms, tried)
        worthwhile = [c for c in candidates if c.score > floor]
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
            self.stop_reason = (f"converged: no untried one-lever move is predicted to gain more than "
                                f"{floor:.1%} over the incumbent")
        return []

    def _goal_jump(self, view: PlannerView, incumbent: Layout, tried: list, floor: float) -> Proposal | None:
        """Stuck: no one-lever move is left worth a trial, yet the estimator's goal (its best layout
        the gate rules allow) is predicted better by more than `floor`. It is often two levers away
        (TP down and CP up: neither fits alone), so it is measured as it is, once."""
        goal = self._goal_levers(view)
        if goal is None or goal in tried or goal == view.incumbent:
            return None
        gain = _predicted_gain(view.recipe, incumbent, goal)
        if gain <= floor:
            return None
        if view.affordable is not None and not view.affordable(goal):
            self.stop_reason = (f"budget spent: the estimator's best layout the gate allows, predicted {gain:+.1%} "
                                f"over the incumbent, costs more than the {hours_text(view.budget_left_gpu_hours)} GPU-hours "
                                f"left can pay with its confirmation ({self.stop_reason})")
            return None
        stuck = self.stop_reason
        return _jump(incumbent, goal, gain, lambda n: f"rule goal-jump: no one-lever move is left worth a trial "
                                                      f"({stuck}); the estimator's best layout the gate allows is "
                                                      f"{n} levers away and predicted {gain:+.1%}")

    def _credit_goal(self, view: PlannerView, incumbent: Layout, candidates: list[Candidate]) -> None:
        """Credit each improving candidate with GOAL_WEIGHT x the goal's predicted gain over the
        incumbent x the share of the remaining distance (levers that differ) it closes."""
        goal = self._goal_levers(view)
        if goal is None:
            return
        here = incumbent.levers()
        distance = sum(here[k] != v for k, v in goal.items())
        if distance == 0:
            return
        ahead = _predicted_gain(view.recipe, incumbent, goal)
        if ahead <= 0:
            return
        for c in candidates:
            closer = sum((c.levers[k] == v) - (here[k] == v) for k, v in goal.items())
            c.goal_credit = GOAL_WEIGHT * ahead * max(0, closer) / distance

    def _goal_levers(self, view: PlannerView) -> dict[str, Scalar] | None:
        """The estimator's best-predicted layout that passes the gate rules in force (once)."""
        if not self._goal_done:
            from attune.planners.estimates import rank_layouts

            self._goal_done = True
            ranked = rank_layouts(view.recipe, headroom=GOAL_HEADROOM)
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
                        self._goal = levers
                        break
                checks += 1
                if checks >= GOAL_CHECKS:
                    break
        return self._goal

    def _goal_first(self, view: PlannerView, incumbent: Layout, floor: float) -> Proposal | None:
        """Only the baseline is measured: the estimator's goal is the first trial if it is predicted
        to gain more than `floor` and the budget pays for it."""
        goal = self._goal_levers(view)
        if goal is None or goal == view.incumbent:
            return None
        gain = _predicted_gain(view.recipe, incumbent, goal)
        if gain <= floor or (view.affordable is not None and not view.affordable(goal)):
            return None
        note = self.gate.note(goal)
        return _jump(incumbent, goal, gain, lambda n: f"rule goal-first: the estimator's best layout the gate allows "
                                                      f"is {n} lever(s) from the baseline and predicted {gain:+.1%}: "
                                                      f"measured first, then refined one lever at a time{note}")

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
        if not self.gate.allows(recipe, moved):
            return None
        if self.gate.tier(recipe, moved)[1] and not self.gate.numerics_pass(moved):
            return None
        return Proposal(levers=moved, move={AC_MODE: moved[AC_MODE]}, lesson_id="oom-recompute",
                        rationale=f"rule oom-recompute: the last layout ran out of memory; retried with "
                                  f"{moved[AC_MODE]} recomputation before abandoning it")

    def _recheck(self, view: PlannerView, last: Observation) -> Proposal | None:
        """The last trial once more, if it measured a gain inside the band the estimator expected it to clear."""
        if not last.result.ok or last.levers == view.incumbent or last.levers == view.history[0].levers:
            return None
        if sum(1 for obs in view.history if obs.levers == last.levers and obs.result.ok) != 1 or not view.incumbent_tps:
            return None
        measured = last.result.tokens_per_sec_per_gpu / view.incumbent_tps - 1
        recipe = view.recipe
        here = predict(recipe, resolve_layout(config_for(recipe, view.incumbent), recipe.architecture, recipe.cluster))
        there = predict(recipe, resolve_layout(config_for(recipe, last.levers), recipe.architecture, recipe.cluster))
        expected = there.tokens_per_sec_per_gpu / here.tokens_per_sec_per_gpu - 1
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

    def _compensations(self, view: PlannerView, incumbent: Layout, move: dict[str, Scalar]) -> list[tuple[dict, str]]:
        """The move as it is, then with the compensation it may force: more recomputation or a
        smaller micro-batch to fit memory (estimator-fit), no recomputation where recomputing would
        hit a known defect (gate-safe), or both an AC mode and a micro-batch."""
        fit, safe = "estimator-fit" not in self.disabled, "gate-safe" not in self.disabled
        modes = []
        if AC_MODE not in move:
            modes = [m for m in (["selective", "full"] if fit else []) + (["none"] if safe else [])
                     if m != incumbent.ac_mode]
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
            pred = predict(recipe, layout)
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


def _jump(incumbent: Layout, goal: dict[str, Scalar], gain: float, why) -> Proposal:
    """The goal measured as it is; why(n) is the rationale, n the number of levers it moves."""
    moved = {k: v for k, v in goal.items() if incumbent.levers()[k] != v}
    return Proposal(levers=dict(goal), move=moved, expected_gain=gain, rationale=why(len(moved)))


def _predicted_gain(recipe: Recipe, incumbent: Layout, levers: dict[str, Scalar]) -> float:
    """The public estimator's relative gain of these levers over the incumbent."""
    there = predict(recipe, resolve_layout(config_for(recipe, levers), recipe.architecture, recipe.cluster))
    return there.tokens_per_sec_per_gpu / predict(recipe, incumbent).tokens_per_sec_per_gpu - 1
