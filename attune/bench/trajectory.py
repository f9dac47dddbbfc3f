"""The incumbent over a campaign's GPU-hours, replayed from its persisted trials.

The campaign does not store its incumbent's history, only every trial in order; the rule that
made a trial the incumbent is attune.campaign.engine._maybe_new_incumbent (a successful search
trial whose throughput beats the incumbent's mean measured so far by the noise band), applied
here to the same records in the same order.
"""

from __future__ import annotations

from typing import Any

from attune.campaign.state import CampaignState


def incumbent_trajectory(state: CampaignState) -> list[tuple[float, dict[str, Any]]]:
    """[(GPU-hours charged after trial i, levers of the incumbent then), ...] for every trial."""
    band = state.noise_band or 0.0
    spent = 0.0
    incumbent: dict[str, Any] | None = None
    out: list[tuple[float, dict[str, Any]]] = []
    for i, record in enumerate(state.trials):
        spent += record.result.gpu_hours
        if record.role == "baseline" and incumbent is None and record.result.ok:
            incumbent = record.levers
        elif record.role == "trial" and record.result.ok and incumbent is not None:
            seen = [t.tps for t in state.trials[: i + 1] if t.levers == incumbent and t.result.ok]
            if seen and record.tps > sum(seen) / len(seen) * (1 + band):
                incumbent = record.levers
        if incumbent is not None:
            out.append((spent, incumbent))
    return out
