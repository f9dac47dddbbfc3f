"""The incumbent over a campaign's GPU-hours, replayed from its persisted trials.

The campaign does not store its incumbent's history, only every trial in order; the rule that
made a trial the incumbent (attune.campaign.engine.beats_incumbent) is applied here to the same
records in the same order.
"""

from __future__ import annotations

from typing import Any

from attune.campaign.engine import beats_incumbent
from attune.campaign.state import CampaignState


def incumbent_trajectory(state: CampaignState) -> list[tuple[float, dict[str, Any]]]:
    """[(GPU-hours charged after trial i, levers of the incumbent then), ...] for every trial."""
    spent = 0.0
    incumbent: dict[str, Any] | None = None
    out: list[tuple[float, dict[str, Any]]] = []
    for i, record in enumerate(state.trials):
        spent += record.result.gpu_hours
        if record.role == "baseline" and incumbent is None and record.result.ok:
            incumbent = record.levers
        elif (record.role == "trial" and record.result.ok and incumbent is not None and record.levers != incumbent
              and beats_incumbent(state.trials[: i + 1], record.levers, incumbent, state.noise_rel_sd)):
            incumbent = record.levers
        if incumbent is not None:
            out.append((spent, incumbent))
    return out
