"""What a campaign would have shipped had it stopped after each trial, replayed from its trials.

The campaign does not store its incumbent's history, only every trial in order. The rules are the
campaign's own, applied to the same records in the same order: the incumbent after each trial is
attune.campaign.engine.best_measured; stopping ships the incumbent if the gate passes it, and a
refused incumbent falls back on attune.campaign.engine.best_exact. The gate's real verdicts are
known for the candidates the campaign gated and the layouts its planner probed; any other incumbent
is judged by the gate's public config check (objective fields, known defects), and a numerics-tier
(float8) one counts as refused: only the proxy's convergence check could pass it, and the campaign
ran it on its final candidates.
"""

from __future__ import annotations

from typing import Any

from attune.campaign.engine import best_exact, best_measured
from attune.campaign.state import CampaignState
from attune.levers import layout_key
from attune.planners.gate_rules import GateRules
from attune.recipe import Recipe


def _incumbents(state: CampaignState):
    """(i, GPU-hours charged after trial i, levers of the incumbent then) for every trial from the
    first successful baseline run on."""
    spent = 0.0
    incumbent: dict[str, Any] | None = None
    for i, record in enumerate(state.trials):
        spent += record.result.gpu_hours
        if record.role == "baseline" and incumbent is None and record.result.ok:
            incumbent = record.levers
        elif record.role == "trial" and record.result.ok and incumbent is not None:
            incumbent = best_measured(state.trials[: i + 1], state.noise_rel_sd) or incumbent
        if incumbent is not None:
            yield i, spent, incumbent


def incumbent_trajectory(state: CampaignState) -> list[tuple[float, dict[str, Any]]]:
    """[(GPU-hours charged after trial i, levers of the incumbent then), ...]."""
    return [(spent, incumbent) for _, spent, incumbent in _incumbents(state)]


class GateJudge:
    """The gate's verdict on a layout as the campaign knew it or would have learnt it."""

    def __init__(self, recipe: Recipe, state: CampaignState):
        self.recipe = recipe
        self.known = {layout_key(p["levers"]): bool(p["passed"]) for p in state.gate_probes}
        self.known |= {layout_key(r["levers"]): False for r in state.rejected}
        if state.gate is not None and state.incumbent_record is not None:
            self.known[layout_key(state.incumbent_record.levers)] = bool(state.gate.get("passed"))
        self._config = GateRules()   # the public config check, as the planner asks it

    def verdict(self, levers: dict[str, Any]) -> tuple[bool, bool]:
        """(the gate passes it, it is in the numerics tier)."""
        key = layout_key(levers)
        passes, numerics = self._config.tier(self.recipe, levers)
        if key in self.known:
            passes = self.known[key]
        elif numerics:
            passes = False
        return passes, numerics


def shipped_trajectory(state: CampaignState, recipe: Recipe) -> list[tuple[float, dict[str, Any]]]:
    """[(GPU-hours charged after trial i, levers a stop there would ship), ...]."""
    judge = GateJudge(recipe, state)
    baseline = next(t.levers for t in state.trials if t.role == "baseline")
    out = []
    for i, spent, incumbent in _incumbents(state):
        passes, _ = judge.verdict(incumbent)
        ships = incumbent if passes or incumbent == baseline else baseline
        if not passes:
            fallback = best_exact(state.trials[: i + 1], recipe, state.noise_rel_sd)
            if fallback is not None and judge.verdict(fallback)[0]:
                ships = fallback
        out.append((spent, ships))
    return out
