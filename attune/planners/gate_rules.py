"""What the `attune` planner knows of the correctness gate before it measures a layout.

  config check   the gate's public config check (objective fields, known stack defects) of every
                 layout the planner looks at, memoised: passes it, and is it in the numerics tier
                 (float8: only the convergence check on the proxy can pass it)
  probes         gate-probe: the whole gate, proxy included, asked before a numerics-tier layout is
                 proposed (PlannerView.gate_probe; CPU only, no GPU-hours), at most PROBE_LIMIT times
  numerics_open  exact-first: without probes, numerics-tier layouts wait until the walk without
                 them has converged
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attune.campaign.tier import gate_verdict
from attune.levers import Scalar, layout_key
from attune.recipe import Recipe

PROBE_LIMIT = 4   # gate runs on the proxy a campaign spends on numerics-tier candidates (seconds to a minute
                  # of CPU each; one refused float8 trial costs a GPU trial and a fall back)


@dataclass
class GateRules:
    disabled: frozenset[str] = frozenset()
    probe: Any = None                  # PlannerView.gate_probe while gate-probe is on, else None
    numerics_open: bool = False        # exact-first: numerics-tier layouts allowed from now on
    probed: dict[tuple, bool] = field(default_factory=dict)   # probes this campaign ran (PlannerView.probed too)

    def see(self, view, probing: bool = True) -> None:
        """Before a proposal: the view's probe (while probing is on) and the probes the campaign
        already ran (its state is the record: a resumed campaign does not probe them again)."""
        self.probe = view.gate_probe if probing else None
        self.probed |= view.probed

    def tier(self, recipe: Recipe, levers: dict[str, Scalar]) -> tuple[bool, bool]:
        """(the config check passes it, it is in the numerics tier)."""
        return gate_verdict(recipe, levers)

    def allows(self, recipe: Recipe, levers: dict[str, Scalar]) -> bool:
        """gate-safe: the config check passes it; a numerics-tier layout also needs numerics_allowed."""
        passed, numerics = self.tier(recipe, levers)
        return (passed or "gate-safe" in self.disabled) and (not numerics or self.numerics_allowed(levers))

    def probing(self) -> bool:
        return self.probe is not None and len(self.probed) < PROBE_LIMIT

    def numerics_allowed(self, levers: dict[str, Scalar]) -> bool:
        """May this numerics-tier layout be a candidate (probed later, when it is picked)? With a
        probe, only while probes are left: after PROBE_LIMIT of them float8 is done with."""
        key = layout_key(levers)
        if key in self.probed:
            return self.probed[key]
        if self.probe is not None:
            return self.probing()
        return self.numerics_open or "exact-first" in self.disabled

    def numerics_pass(self, levers: dict[str, Scalar]) -> bool:
        """The verdict on a numerics-tier layout about to be proposed (the probe is asked now if it can be)."""
        key = layout_key(levers)
        if key not in self.probed and self.probing():
            self.probed[key] = bool(self.probe(levers))
        if key in self.probed:
            return self.probed[key]
        return self.numerics_allowed(levers)

    def note(self, levers: dict[str, Scalar]) -> str:
        """For a proposal's rationale."""
        return "; the gate passed its numerics on the proxy (probe)" if self.probed.get(layout_key(levers)) else ""


def defect_screen(recipe: Recipe, arrays) -> np.ndarray:
    """Per layout of `arrays` (attune.sim.arrays.LayoutArrays, the recipe's space): does it certainly
    match a known stack defect (gate/defects.toml) that the config check would refuse it for? The
    conditions on levers and on layout attributes are evaluated over the whole space at once; a
    condition that cannot be (another config field, an unknown key) is read from the recipe, and
    where that is not possible either the defect is not screened (the config check still decides
    each layout before it is proposed). A screen, not the gate: it only saves config checks."""
    from attune.gate.defects import in_range, parse_condition
    from attune.gate.defects import _lookup as recipe_value   # noqa: PLC2701 - the same lookup the gate makes

    certain = np.zeros(len(arrays), dtype=bool)
    for defect, _, _ in in_range(recipe):
        hits = np.ones(len(arrays), dtype=bool)
        for condition in defect.when:
            key, op, value = parse_condition(condition)
            column = _column(arrays, key)
            if column is None:
                try:
                    actual = recipe_value(recipe, key)
                    column = np.full(len(arrays), bool(_OPS[op](actual, value)))
                except Exception:  # noqa: BLE001 - not decidable here: leave it to the config check
                    hits[:] = False
                    break
            else:
                column = _compare(column, op, value)
            hits &= column
        certain |= hits
    return certain


def _column(a, key: str) -> np.ndarray | None:
    """The value of a lever or layout attribute per layout, as the config check sees it (None when
    the key is neither)."""
    from attune.sim.arrays import AC_MODES, FLOAT8_MODES, SCHEDULES

    tp, pp, cp, ep, dpr, dps = (np.asarray(x) for x in (a.tp, a.pp, a.cp, a.ep, a.dpr, a.dps))
    lb, gbs, mb = np.asarray(a.lb), np.asarray(a.gbs), np.asarray(a.mb)
    columns = {
        "parallelism.tensor_parallel_degree": tp, "layout.tp": tp,
        "parallelism.pipeline_parallel_degree": pp, "layout.pp": pp,
        "parallelism.context_parallel_degree": cp, "layout.cp": cp,
        "parallelism.expert_parallel_degree": ep, "layout.ep": ep,
        "parallelism.data_parallel_replicate_degree": dpr, "layout.dp_replicate": dpr,
        "parallelism.data_parallel_shard_degree": dps, "layout.dp_shard": dps,
        "layout.dp": dpr * dps, "training.local_batch_size": lb, "layout.local_batch": lb,
        "layout.grad_accum": gbs // np.maximum(lb * dpr * dps, 1),
        "layout.n_microbatches": np.where(pp > 1, lb // np.maximum(mb, 1), 1),
        "parallelism.pipeline_parallel_microbatch_size": mb, "layout.pp_microbatch": mb,
        "compile.enable": np.asarray(a.comp, dtype=bool), "layout.compile": np.asarray(a.comp, dtype=bool),
    }
    if key in columns:
        return columns[key]
    named = {"activation_checkpoint.mode": AC_MODES, "layout.ac_mode": AC_MODES, "quantize.float8": FLOAT8_MODES,
             "layout.float8": FLOAT8_MODES, "parallelism.pipeline_parallel_schedule": SCHEDULES,
             "layout.pp_schedule": SCHEDULES}
    column = {"activation_checkpoint.mode": a.ac, "layout.ac_mode": a.ac, "quantize.float8": a.f8,
              "layout.float8": a.f8, "parallelism.pipeline_parallel_schedule": a.sched, "layout.pp_schedule": a.sched}
    if key in named:
        return np.asarray(named[key], dtype=object)[np.asarray(column[key])]
    return None


def _compare(column: np.ndarray, op: str, value) -> np.ndarray:
    if op == "in":
        return np.isin(column, list(value))
    if op == "not in":
        return ~np.isin(column, list(value))
    return np.asarray(_OPS[op](column, value), dtype=bool)


_OPS = {"==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
