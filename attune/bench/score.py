"""A benchmark campaign scored on the ground truth by the evaluator (attune/bench/truth.py; the
planner never sees it): the shipped layout's true gain and what the campaign would have shipped at
each point of its run."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def score_campaign(cell, result: dict[str, Any]) -> dict[str, Any]:
    """The campaign's result plus its ground-truth score and its incumbent trajectory (each point
    the ground-truth gain of what the campaign would ship if it stopped there)."""
    from attune.bench.trajectory import shipped_trajectory
    from attune.bench.truth import truth_tps
    from attune.campaign.state import CampaignState
    from attune.campaign.inputs import load_campaign_recipe
    from attune.levers import layout_key

    recipe = load_campaign_recipe(cell.path, cell.cluster, cell.recipe.model_spec)
    state = CampaignState.load(Path(result["campaign_dir"]) / "state.json")
    baseline_levers = recipe.layout().levers()
    shipped_levers = result["best"]["levers"] if result["shipped"] else baseline_levers
    cache: dict[tuple, float] = {}

    def tps(levers: dict) -> float:
        key = layout_key(levers)
        if key not in cache:
            cache[key] = truth_tps(recipe, levers, cell.cluster_seed, cell.world)
        return cache[key]

    gate = result.get("gate") or None
    base = tps(baseline_levers)
    trajectory = [[h, tps(levers) / base - 1.0] for h, levers in shipped_trajectory(state, recipe)]
    shipped = tps(shipped_levers)
    # what the search settled on, before the gate (and before any fallback from a refused float8 candidate)
    searched = tps(state.rejected[0]["levers"] if state.rejected else state.incumbent_record.levers)
    trajectory.append([result["gpu_hours_used"], shipped / base - 1.0])
    baseline_hours = sum(t.result.gpu_hours for t in state.trials if t.role == "baseline")
    return {"baseline_gpu_hours": baseline_hours, "gain": shipped / base - 1.0, "search_gain": searched / base - 1.0, "measured_gain": result["gain"], "truth_baseline_tps": base,
            "truth_shipped_tps": shipped, "trajectory": trajectory,
            "tps_trajectory": [[h, (1.0 + g) * base] for h, g in trajectory],
            "gpu_hours_used": result["gpu_hours_used"], "trials": result["trials"], "shipped": result["shipped"],
            "gate_passed": (bool(gate.get("passed")) if gate else None), "stop_reason": result["stop_reason"],
            "gate_runs": len(state.rejected) + (1 if gate else 0), "fell_back": bool(state.rejected),
            "shipped_levers": shipped_levers, "campaign_id": result["campaign_id"]}
