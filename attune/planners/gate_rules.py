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

from dataclasses import dataclass, field
from typing import Any

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
