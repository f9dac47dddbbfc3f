"""What the measured trials say about this cluster that the public estimator does not know.

The estimator is the public step model with neutral effects (attune/sim/effects.py): on a real
cluster a precision's kernels are slower, the fabric is slower, less communication hides behind
compute, a schedule's bubble is heavier, memory runs out sooner. A trial's profiler breakdown says
which: compute, recomputation and bubble time, and for each kind of collective its whole time and
the part not hidden behind compute. ClusterFit fits the step model's own effect hooks to those
measurements, so its predictions keep the model's physics (a collective that was hidden on the
measured layout and would be exposed on another is predicted exposed there):

  compute        a time multiplier per precision (bf16 | float8)    <- compute time
  recompute      selective recomputation's cost                     <- recompute time (selective)
  bubble         per pipeline schedule                              <- bubble time
  links          inter-node and NVLink bandwidth, all-to-all and the CP ring on top
                                                                    <- each collective's whole time
  overlap        the share of FSDP traffic hidden, the exposed share of TP, EP and PP traffic
                                                                    <- each collective's exposed time
  memory         measured / predicted peak (an out-of-memory trial bounds it from below)

Each hook moves by the seconds-weighted geometric mean of measured / predicted over the trials that
show its part, a few passes so that hooks that share a part (the inter-node link and all-to-all)
settle together. Where a stack reports no breakdown (torchtitan's logs give the step time), one
ratio of the whole step stands in: it corrects the level, not the ranking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from attune.layout import Layout
from attune.planners.estimates import Prediction
from attune.recipe import Recipe
from attune.sim.arrays import AC_MODES, SCHEDULES, LayoutArrays
from attune.sim.effects import Effects

COMM = ("fsdp", "tp", "pp", "ep", "cp", "dp_replicate")
SHARE_FLOOR = 0.005    # a part below this share of the step (measured and predicted) says nothing
CLIP = (0.25, 4.0)     # no hook moves further from the model than this
PASSES = 5
OOM_MARGIN = 1.02      # an out-of-memory layout needed at least this much more than the device held
SELECTIVE = AC_MODES.index("selective")


@dataclass(frozen=True)
class FittedEffects(Effects):
    """The step model's effect hooks as fitted to one cluster's trials (compute as time multipliers)."""
    compute_bf16: float = 1.0
    compute_fp8: float = 1.0

    def gemm(self, kind, m, n, prec):
        return 1.0 / np.where(np.asarray(prec) > 0, self.compute_fp8, self.compute_bf16)

    def attention(self, chunk, cp):
        return 1.0 / self.compute_bf16


def _inter(la: LayoutArrays, gpus_per_node: int) -> dict[str, np.ndarray]:
    """Per communication kind: does its group span nodes (bool per layout)?"""
    tp, cp, dps, dpr, pp = (np.asarray(x) for x in (la.tp, la.cp, la.dps, la.dpr, la.pp))
    world = tp * cp * dps * dpr * pp
    return {"fsdp": dps * cp * tp > gpus_per_node, "tp": tp > gpus_per_node, "ep": np.asarray(la.ep) > gpus_per_node,
            "cp": tp * cp > gpus_per_node, "pp": world / pp >= gpus_per_node,
            "dp_replicate": dpr * dps * cp * tp > gpus_per_node}


def _link_hook(kind: str, inter: bool) -> str:
    """The Effects field that scales a collective's whole time on its link."""
    if kind == "ep":
        return "a2a_inter_slow" if inter else "a2a_intra_slow"
    if kind == "cp":
        return "cp_ring_slow"
    return "net_slow" if inter else "nvlink_slow"


_EXPOSURE_HOOK = {"tp": "tp_exposed", "ep": "ep_exposed", "pp": "pp_exposed"}


@dataclass
class ClusterFit:
    """Fitted effects and memory; neutral (the public estimator itself) before any trial."""

    effects: FittedEffects = field(default_factory=FittedEffects)
    memory_factor: float = 1.0       # the largest measured / predicted peak (an out-of-memory trial's floor too)
    memory_central: float = 1.0      # their geometric mean: the memory a layout most likely needs
    step_factor: float = 1.0          # stacks without a breakdown: the whole step's ratio
    observed: int = 0

    # --- learning --------------------------------------------------------------------------------
    @classmethod
    def from_trials(cls, recipe: Recipe, trials: Sequence) -> "ClusterFit":
        """From (layout, TrialResult) pairs: ok trials teach the hooks and memory, OOM ones memory."""
        from attune.sim.estimator import as_arrays

        fit = cls()
        ok = [(as_arrays(recipe, [layout]), result) for layout, result in trials if result.ok and result.step_time_s]
        fit.observed = len(ok)
        profiled = [(la, r) for la, r in ok if r.breakdown.get("compute_s") is not None]
        for _ in range(PASSES if profiled else 0):
            fit.effects = fit._pass(recipe, profiled)
        bare = [(la, r) for la, r in ok if r.breakdown.get("compute_s") is None]
        if bare:
            ratios = [r.step_time_s / float(fit._columns(recipe, la)["step_s"][0]) for la, r in bare]
            fit.step_factor = float(np.exp(np.mean(np.log(ratios))))
        ratios = [r.peak_memory_gib / float(fit._columns(recipe, la)["mem_total_gib"][0]) for la, r in ok
                  if r.peak_memory_gib and r.peak_memory_gib < recipe.cluster.memory_gib]
        floor = max((OOM_MARGIN * recipe.cluster.memory_gib / float(fit._columns(recipe, as_arrays(recipe, [layout]))
                                                                    ["mem_required_gib"][0])
                     for layout, result in trials if result.status.value == "oom"), default=0.0)
        fit.memory_factor = max(max(ratios, default=1.0), floor)
        if ratios:   # an out-of-memory trial bounds its own layout, not the level: see the planner's memory model
            fit.memory_central = float(np.exp(np.mean(np.log(ratios))))
        return fit

    def _pass(self, recipe: Recipe, profiled: list) -> FittedEffects:
        """One pass: every hook moved by the weighted mean log ratio of the parts it drives."""
        moves: dict[str, list[float]] = {}

        def vote(hook: str, measured: float, predicted: float, step: float) -> None:
            if measured <= 0 or predicted <= 0 or max(measured, predicted) < SHARE_FLOOR * step:
                return
            total = moves.setdefault(hook, [0.0, 0.0])
            total[0] += (measured + predicted) * float(np.log(measured / predicted))
            total[1] += measured + predicted

        for la, result in profiled:
            est, b, step = self._columns(recipe, la), result.breakdown, float(result.step_time_s)
            at = lambda key: float(est[key][0])  # noqa: E731
            vote("compute_fp8" if int(la.f8[0]) > 0 else "compute_bf16", b["compute_s"], at("compute_s"), step)
            if int(la.ac[0]) == SELECTIVE:
                vote("sac_recompute", b.get("recompute_s", 0.0), at("recompute_s"), step)
            if at("bubble_s") > 0:
                vote(f"bubble/{SCHEDULES[int(la.sched[0])]}", b.get("bubble_s", 0.0), at("bubble_s"), step)
            inter = _inter(la, recipe.cluster.node_size)
            totals, exposed = b.get("comm_total_s") or {}, b.get("exposed_comm_s") or {}
            for kind in COMM:
                t_meas, t_pred = totals.get(kind, 0.0), at(f"{kind}_total_s")
                vote(_link_hook(kind, bool(inter[kind][0])), t_meas, t_pred, step)
                e_meas, e_pred = exposed.get(kind, 0.0), at(f"{kind}_s")
                if kind in _EXPOSURE_HOOK and t_meas > 0 and t_pred > 0:
                    vote(_EXPOSURE_HOOK[kind], e_meas / t_meas, e_pred / t_pred, 1.0)
                elif kind == "fsdp" and t_meas > 0 and t_pred > 0:   # overlap: the hidden share
                    vote("fsdp_overlap", max(t_meas - e_meas, 0.0) / t_meas, max(t_pred - e_pred, 0.0) / t_pred, 1.0)
        fx = self.effects
        updates = {}
        for hook, (weighted, weight) in moves.items():
            factor = float(np.exp(weighted / weight))
            if hook.startswith("bubble/"):
                name = hook.split("/", 1)[1]
                table = dict(updates.get("bubble_slow", fx.bubble_slow))
                table[name] = float(np.clip(table.get(name, 1.0) * factor, *CLIP))
                updates["bubble_slow"] = table
            else:
                updates[hook] = float(np.clip(getattr(fx, hook) * factor, *CLIP))
        return replace(fx, **updates)

    # --- predicting ------------------------------------------------------------------------------
    def _columns(self, recipe: Recipe, la: LayoutArrays) -> dict[str, np.ndarray]:
        from attune.sim.estimator import STACK, recipe_hardware
        from attune.sim.stepmodel import evaluate
        return evaluate(recipe.architecture, recipe_hardware(recipe), la, STACK, self.effects)

    def columns(self, recipe: Recipe, la: LayoutArrays) -> dict[str, np.ndarray]:
        """step_s, tps, mem_total_gib and fits for every layout, as the fitted model predicts them."""
        cols = self._columns(recipe, la)
        memory = cols["mem_total_gib"] * self.memory_factor
        return {"step_s": cols["step_s"] * self.step_factor, "tps": cols["tps"] / self.step_factor,
                "mem_total_gib": memory, "mem_estimate_gib": cols["mem_total_gib"],
                "fits": cols["mem_required_gib"] * self.memory_factor <= recipe.cluster.memory_gib}

    def predict(self, recipe: Recipe, layout: Layout) -> Prediction:
        """One layout (the public estimator's prediction while nothing was measured)."""
        from attune.sim.estimator import as_arrays

        c = self.columns(recipe, as_arrays(recipe, [layout]))
        return Prediction(fits=bool(c["fits"][0]), tokens_per_sec_per_gpu=float(c["tps"][0]),
                          peak_memory_gib=float(c["mem_total_gib"][0]), step_time_s=float(c["step_s"][0]))

    def summary(self) -> str:
        """The hooks that depart from the model by more than 5%, for a proposal's rationale."""
        neutral, shown = FittedEffects(), []
        for name in ("compute_bf16", "compute_fp8", "sac_recompute", "net_slow", "nvlink_slow", "a2a_inter_slow",
                     "a2a_intra_slow", "cp_ring_slow", "fsdp_overlap", "tp_exposed", "ep_exposed", "pp_exposed"):
            value = getattr(self.effects, name)
            if abs(value / getattr(neutral, name) - 1) > 0.05:
                shown.append(f"{name} x{value:.2f}")
        shown += [f"bubble {s} x{v:.2f}" for s, v in self.effects.bubble_slow.items() if abs(v - 1) > 0.05]
        for name, value in (("memory", self.memory_factor), ("step", self.step_factor)):
            if abs(value - 1) > 0.02:
                shown.append(f"{name} x{value:.2f}")
        return ", ".join(shown)


def fit_from_history(recipe: Recipe, history) -> ClusterFit:
    """The fit of a planner's history (attune.planners.base.Observation)."""
    from attune.space import layout_of

    pairs: list[tuple[Layout, object]] = []
    for obs in history:
        if obs.result.ok or obs.result.status.value == "oom":
            layout = layout_of(recipe, obs.levers, check=False)
            pairs.append((layout, obs.result))
    return ClusterFit.from_trials(recipe, pairs)
