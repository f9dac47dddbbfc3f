"""The `attune` planner: one rule chooses the next trial and when to stop, expected improvement per
GPU-hour under the model's own error.

Every untried layout of the space gets a predictive distribution of its throughput:

  mean           the public estimator fitted to what the trials' profiler breakdowns measured
                 (cluster-fit; attune.planners.cluster_fit; the estimator as it is where no trial has
                 one, attune.planners.belief.profiled), plus the lessons the incumbent's diagnosis matches:
                 each shifts the layouts that make its move by its prior gain, with its own width (lessons)
  uncertainty    a Gaussian process on the fitted model's log-residual (attune.planners.residual_gp):
                 a measured layout tells how far the model is off on layouts a few levers away
                 (residual-gp), its width the estimator's known error calibrated by the belief's own
                 out-of-sample misses on this campaign's trials (learned-width; attune.planners.belief)
  memory         the chance it fits, from the fitted memory model and a GP of its own (memory-risk)

The next trial is the layout with the highest expected improvement over the incumbent (by more than
half the noise band) times its chance to fit, per GPU-hour: its run, and the confirmation runs and
gate a win would add times the chance it wins (cost-aware; where the budget left pays only a few
trials, by EI alone: a cheaper trial then saves nothing that would buy another). The search stops
when that best trial would repay less than it costs over the training the recipe will run (EI x
`--training-hours` x GPUs < its cost: payback-stop), or when the budget cannot pay for any trial
worth running; the stop reason names the best remaining trial and its figures. So near-ties inside
the model's error are measured while budget is left, and a model that keeps proving right stops
early.

The gate's rules stay as they were (attune.planners.gate_rules): a layout the config check refuses
is never proposed (gate-safe), a float8 one only after the proxy passed it (gate-probe), and without
probes no float8 layout until the exact tier is done (exact-first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from scipy.stats import norm

from attune.campaign.budget import hours_text
from attune.layout import AC_MODE, COMPILE, CP, DP_REPLICATE, EP, FLOAT8, LOCAL_BATCH, PP, PP_MICROBATCH, PP_SCHEDULE, TP
from attune.lessons.catalog import Lesson, load_lessons, match
from attune.lessons.posterior import posterior
from attune.levers import Scalar, levers_text, lever
from attune.planners.base import PlannerView, Proposal
from attune.planners.belief import Belief, measured_arrays
from attune.planners.gate_rules import PROBE_LIMIT, GateRules, defect_screen
from attune.planners.residual_gp import Prior, ResidualGP, features, log_expected_improvement
from attune.recipe import Recipe
from attune.sim.arrays import LayoutArrays
from attune.space import layout_of

SEARCH_RULES = ("cluster-fit", "residual-gp", "learned-width", "lessons", "memory-risk", "cost-aware", "payback-stop")
RULES = SEARCH_RULES + ("gate-safe", "gate-probe", "exact-first")
PRICED = 200           # candidates, best by EI x chance to fit, whose trial cost is computed exactly
GATE_CHECKS = 500      # config checks spent on one proposal at most (about 10 ms each)
WIDEN = 10             # while none of them is affordable, up to this many times as many are priced
FEW = 3                # trials the budget left must pay (at the median cost) for EI per GPU-hour to rank them
KEEP = 30_000          # candidates the GPs are asked about at most: the best-predicted (the model's best 4% of an
                       # 800,000-layout MoE space; every layout of the CPU benchmark's spaces)
_COLUMNS = {TP: "tp", PP: "pp", CP: "cp", EP: "ep", DP_REPLICATE: "dpr", LOCAL_BATCH: "lb", PP_SCHEDULE: "sched",
            PP_MICROBATCH: "mb", AC_MODE: "ac", COMPILE: "comp", FLOAT8: "f8"}


@dataclass
class Space:
    """The recipe's lever space as arrays, with what the planner asks of every layout."""
    arrays: LayoutArrays
    x: np.ndarray          # residual_gp.features
    codes: np.ndarray      # one int per layout (measured layouts are matched by it)
    defective: np.ndarray  # the layout certainly matches a known stack defect (gate_rules.defect_screen)

    @classmethod
    def of(cls, recipe: Recipe) -> "Space":
        from attune.sim.estimator import as_arrays
        from attune.sim.space_arrays import space_arrays
        arrays = as_arrays(recipe, space_arrays(recipe))
        return cls(arrays=arrays, x=features(arrays), codes=_codes(arrays), defective=defect_screen(recipe, arrays))


def _codes(a: LayoutArrays) -> np.ndarray:
    code = np.zeros(len(a), dtype=np.int64)
    for column in ("tp", "pp", "cp", "ep", "dpr", "dps", "lb", "sched", "mb", "ac", "comp", "f8"):
        code = code * np.int64(1_000_003) + np.asarray(getattr(a, column)).astype(np.int64)   # wraps: a hash
    return code


@dataclass
class Choice:
    """A candidate as the planner weighed it (for the proposal's rationale and the stop reason)."""
    index: int
    levers: dict[str, Scalar]
    ei: float              # expected improvement of log throughput over the threshold, times the chance to fit
    chance: float          # the chance it improves on the threshold
    fit: float             # the chance it fits in memory
    gain: float            # predicted gain over the incumbent (the mean)
    sd: float
    cost: float            # GPU-hours: its trial, and what a win would add times the chance of one
    lesson: str | None = None
    lesson_text: str = ""  # the lesson's prior and its evidence (attune.lessons.posterior.Posterior.text)

    @property
    def value(self) -> float:
        return self.ei / self.cost if self.cost > 0 else float("inf")


@dataclass
class AttunePlanner:
    """See the module docstring. `stop_reason` says why propose() returned None."""

    name: str = "attune"
    reads_lessons: ClassVar[bool] = True
    disabled: frozenset[str] = frozenset()
    lessons: list[Lesson] = field(default_factory=load_lessons)
    gp: ResidualGP = field(default_factory=ResidualGP)
    stop_reason: str = ""
    gate: GateRules = field(init=False)
    belief: Belief = field(init=False)
    _space: Space | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        self.gate = GateRules(disabled=self.disabled)
        self.belief = Belief(fitted=self.on("cluster-fit"), correlated=self.on("residual-gp"),
                             calibrated=self.on("learned-width"), gp=self.gp)

    def on(self, rule: str) -> bool:
        return rule not in self.disabled

    def propose(self, view: PlannerView) -> Proposal | None:
        self.belief.prior, self.belief.prior_sd = list(view.prior), view.prior_sd
        self.belief.update(view.recipe, view.history, view.noise_rel_sd)
        self.gate.see(view, probing=self.on("gate-probe"))
        if self._space is None:
            self._space = Space.of(view.recipe)
        pick = None
        for _ in range(PROBE_LIMIT + 1):   # weighed again after probes refused what was weighed
            probed = len(self.gate.probed)
            pick = self._walk(view, self._weigh(view))
            if pick is not None or len(self.gate.probed) == probed:
                break
        if pick is None and self.gate.probe is None and self.on("exact-first") and not self.gate.numerics_open:
            self.gate.numerics_open = True   # the exact tier is done: float8 layouts may be weighed now
            pick = self._walk(view, self._weigh(view))
        if pick is None:
            return None
        moved = {k: v for k, v in pick.levers.items() if view.incumbent.get(k) != v}
        fitted = self.belief.fit.summary()
        lesson = f"; {pick.lesson_text}" if pick.lesson_text else ""
        fits = f", fits with chance {pick.fit:.0%}" if pick.fit < 0.995 else ""
        return Proposal(levers=pick.levers, move=moved, lesson_id=pick.lesson, expected_gain=pick.gain,
                        rationale=(f"EI +{pick.ei:.1%} for {hours_text(pick.cost)} GPU-h: the model"
                                   f"{f' (fitted: {fitted})' if fitted else ''} predicts {pick.gain:+.1%} "
                                   f"± {pick.sd:.1%}{fits}{lesson}; {len(moved)} lever(s) from the incumbent: "
                                   f"{levers_text(moved)}{self.gate.note(pick.levers)}"))

    # ------------------------------------------------------------------------------------------
    def _weigh(self, view: PlannerView) -> list[Choice]:
        """The PRICED best candidates the config check passes, by EI x chance to fit, priced, best
        EI per GPU-hour first."""
        recipe, space, belief = view.recipe, self._space, self.belief
        cols = belief.fit.columns(recipe, space.arrays)
        model = np.log(np.maximum(cols["tps"], 1e-12))
        measured = measured_arrays(recipe, [obs.levers for obs in view.history])
        candidates = ~np.isin(space.codes, _codes(measured)) if len(measured) else np.ones(len(space.codes), bool)
        if not self._numerics_open():   # float8 layouts: only those a probe passed (gate-probe, exact-first)
            passed = [dict(key) for key, ok in self.gate.probed.items() if ok]
            numerics = np.asarray(space.arrays.f8) != FLOAT8_CODE(recipe)
            candidates &= ~numerics | np.isin(space.codes, _codes(measured_arrays(recipe, passed)))
        if not self.on("memory-risk"):
            candidates &= cols["fits"]
        if self.on("gate-safe"):
            candidates &= ~space.defective   # saves the config checks of layouts it would refuse anyway
        self.stop_reason = ("no moves left: every layout of the space was measured, is predicted not to fit, or is "
                            "one the gate would refuse")
        ok, _ = belief.rows(view.history)   # a warm start's old layouts too
        if not candidates.any() or not ok or not view.incumbent_tps:
            return []
        # improvement over the incumbent by half the noise band: a layout must beat it by about the band to
        # count, but one that beats it by less may still, and noise is in the belief already
        threshold = float(np.log(view.incumbent_tps) + np.log1p(view.noise_band / 2))
        seen = measured_arrays(recipe, [obs.levers for obs in ok])
        priors = self._lesson_priors(view, space.arrays, seen)
        # a layout the model puts below the threshold by more than any residual and 6 sd has no EI worth a number
        residuals = (np.log([o.result.tokens_per_sec_per_gpu for o in ok])
                     - np.log(np.maximum(belief.fit.columns(recipe, seen)["tps"], 1e-12)))
        spread = (np.sqrt(belief.throughput_width ** 2 + sum(p.width ** 2 for p in priors))
                  + sum(abs(p.shift) for p in priors))
        reach = model + float(np.max(np.abs(residuals), initial=0.0)) + 6 * spread >= threshold
        index = np.flatnonzero(candidates & reach)
        if len(index) == 0:
            index = np.flatnonzero(candidates)[np.argsort(-model[candidates], kind="stable")[:PRICED]]
        if len(index) > KEEP:   # the best-predicted, lessons' shifts counted
            hopes = model[index] + sum((max(p.shift, 0.0) * p.where[index] for p in priors), np.zeros(len(index)))
            index = index[np.argsort(-hopes, kind="stable")[:KEEP]]
        log_fit = np.zeros(len(index))
        if self.on("memory-risk"):
            mem_mean, mem_sd = belief.memory(recipe, view.history, space.arrays.take(index), space.x[index],
                                             columns={k: v[index] for k, v in cols.items()})
            log_fit = norm.logcdf((np.log(recipe.cluster.memory_gib) - mem_mean) / mem_sd)
        keep = log_fit > np.log(1e-4)
        index, log_fit = index[keep], log_fit[keep]
        if len(index) == 0:
            return []
        mean, sd = belief.throughput(recipe, view.history, space.arrays.take(index), space.x[index], view.noise_rel_sd,
                                     priors=[Prior(p.shift, p.width, p.where[index], p.where_measured) for p in priors],
                                     columns={k: v[index] for k, v in cols.items()})
        log_ei, log_pi = log_expected_improvement(mean, sd, threshold)
        log_value = log_ei + log_fit
        choices, checks, affordable = [], 0, 0
        for j in np.argsort(-log_value, kind="stable"):
            # PRICED of them, more (up to WIDEN x) while the budget pays for none: a dear best layout must not
            # hide a cheaper one that is worth its trial
            if checks >= GATE_CHECKS * (WIDEN if not affordable else 1) or (
                    len(choices) >= PRICED and (affordable or len(choices) >= WIDEN * PRICED)):
                break
            i = int(index[j])
            levers = space.arrays.layout(i).levers()
            checks += 1
            if not self.gate.allows(recipe, levers):   # gate-safe: the config check (memoised)
                continue
            chance, fits = float(np.exp(log_pi[j])), float(np.exp(log_fit[j]))
            cost = view.trial_cost_gpu_hours(levers) if view.trial_cost_gpu_hours else 1.0
            if view.settle_cost is not None:
                cost += chance * fits * view.settle_cost(levers)
            lesson = next((p for p in priors if p.where[i]), None)
            choices.append(Choice(index=i, levers=levers, ei=float(np.exp(log_value[j])), chance=chance, fit=fits,
                                  gain=float(np.exp(mean[j])) / view.incumbent_tps - 1, sd=float(sd[j]),
                                  cost=cost, lesson=lesson.lesson if lesson else None,
                                  lesson_text=lesson.text if lesson else ""))
            affordable += view.affordable is None or bool(view.affordable(levers))
        if not choices:
            self.stop_reason = ("no moves left: every untried layout with an expected improvement is one the gate "
                                "would refuse")
        return sorted(choices, key=(lambda c: -c.value) if self._per_gpu_hour(view, choices) else (lambda c: -c.ei))

    def _per_gpu_hour(self, view: PlannerView, choices: list[Choice]) -> bool:
        """Rank by EI per GPU-hour (cost-aware) while the budget left pays several trials; where it pays
        at most FEW, by EI: a cheaper trial then saves nothing that would buy another one."""
        if not self.on("cost-aware"):
            return False
        costs = sorted(c.cost for c in choices)
        return not costs or view.budget_left_gpu_hours >= FEW * costs[len(costs) // 2]

    def _walk(self, view: PlannerView, choices: list[Choice]) -> Choice | None:
        """The first choice the gate allows and the budget pays for, if it is worth its cost; else None
        with stop_reason naming the best remaining one."""
        recipe = view.recipe
        worth = view.training_gpu_hours if self.on("payback-stop") else None
        too_dear: Choice | None = None
        for c in choices:
            if self.gate.tier(recipe, c.levers)[1] and not self.gate.numerics_pass(c.levers):
                continue
            if worth is not None and c.ei * worth < c.cost:
                if too_dear is not None:   # what was worth a trial, the budget could not pay
                    break
                self.stop_reason = (f"converged: the best remaining trial, {self._named(view, c)}, expects "
                                    f"+{c.ei:.2%} over the incumbent for {hours_text(c.cost)} GPU-h: over the "
                                    f"{hours_text(worth)} GPU-hours the recipe will train that repays "
                                    f"{hours_text(c.ei * worth)}, less than it costs")
                return None
            if view.affordable is not None and not view.affordable(c.levers):
                too_dear = too_dear or c
                continue
            return c
        if too_dear is not None:
            self.stop_reason = f"budget spent: {self._budget_note(view, too_dear)}"
        elif choices:
            self.stop_reason = ("no moves left: the gate refused every numerics-tier candidate with an expected "
                                "improvement when probed on the proxy, and no other layout has one")
        return None

    def _budget_note(self, view: PlannerView, c: Choice) -> str:
        return (f"the best remaining trial, {self._named(view, c)}, expects +{c.ei:.2%} for "
                f"{hours_text(c.cost)} GPU-h and, with the confirmation it must leave room for, costs more than "
                f"the {hours_text(view.budget_left_gpu_hours)} GPU-hours left")

    @staticmethod
    def _named(view: PlannerView, c: Choice) -> str:
        moved = {k: v for k, v in c.levers.items() if view.incumbent.get(k) != v}
        return levers_text(moved) or "the incumbent"

    def _numerics_open(self) -> bool:
        """May any float8 layout not yet probed be weighed? While probes are left, or without a
        probe once the exact tier is done (exact-first) or with that rule off."""
        g = self.gate
        if g.probe is not None:
            return g.probing()
        return g.numerics_open or not self.on("exact-first")

    def _lesson_priors(self, view: PlannerView, arrays: LayoutArrays, measured: LayoutArrays) -> list["LessonPrior"]:
        """The lessons the incumbent's diagnosis matches, each as a prior on the layouts that make its move:
        the catalog's figure updated by what earlier campaigns in the ledger measured (attune.lessons.posterior)."""
        if not self.on("lessons"):
            return []
        recipe = view.recipe
        incumbent = layout_of(recipe, view.incumbent, check=False)
        symptoms: set[str] = set()
        for obs in reversed(view.history):
            if obs.levers == view.incumbent:
                symptoms = set(obs.diagnosis)
                break
        out = []
        for lesson in match(self.lessons, symptoms, recipe.architecture.is_moe, incumbent):
            where = _makes_move(lesson, incumbent.levers(), arrays)
            if where is None or not where.any():
                continue
            belief = posterior(lesson, view.ledger, view.context)
            out.append(LessonPrior(lesson=lesson.id, text=belief.text(), shift=belief.mean, width=belief.sd,
                                   where=where, where_measured=_makes_move(lesson, incumbent.levers(), measured)))
        return out


@dataclass(frozen=True)
class LessonPrior(Prior):
    lesson: str = ""
    text: str = ""


def FLOAT8_CODE(recipe: Recipe) -> int:  # noqa: N802 - a constant of the recipe
    from attune.sim.arrays import FLOAT8_MODES
    return FLOAT8_MODES.index(recipe.layout().float8)


def _makes_move(lesson: Lesson, here: dict[str, Scalar], arrays: LayoutArrays) -> np.ndarray | None:
    """Per layout: does it change the lesson's lever from `here` the way the lesson says?"""
    key = lesson.try_.lever
    column = _COLUMNS.get(key)
    if column is None:
        return None
    values = np.asarray(getattr(arrays, column))
    catalog = lever(key)
    order = list(catalog.values)

    def code(v: Scalar) -> float:
        return float(order.index(v)) if catalog.kind == "choice" else float(v)

    now = code(here[key])
    if lesson.try_.direction == "set":
        return (values == code(lesson.try_.value)) & (now != code(lesson.try_.value))
    return values > now if lesson.try_.direction == "up" else values < now
