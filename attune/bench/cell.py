"""One benchmark campaign, run in a worker process: the real campaign flow on the sim stack, then
scored on the ground truth by the evaluator (attune/bench/truth.py; the planner never sees it).

Each worker process has its own ATTUNE_HOME, PREFECT_HOME and MLflow SQLite file (set by
`init_worker` before Prefect or MLflow are imported), so two campaigns never write one SQLite file.
Lessons evidence a campaign appends is dropped before the next one: every benchmark campaign starts
from the shipped catalog, so seeds are independent and the order cells run in does not matter.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

# Variables that make a worker's Prefect and MLflow its own (values filled in by init_worker).
_OWN_SQLITE = ("ATTUNE_HOME", "PREFECT_HOME")


def init_worker(base: str, prefect_api_url: str | None = None, gate_cache: str | None = None) -> None:
    """Process-pool initializer: this worker's homes under `base`, its output in worker.log there,
    one thread per math library (the machine's cores are shared by the workers), Prefect and MLflow
    quiet and offline. With `prefect_api_url` (the bench flow's API, ephemeral or not) the worker's
    campaign flows are runs on that server, which alone writes its database."""
    home = Path(base) / f"worker-{os.getpid()}"
    home.mkdir(parents=True, exist_ok=True)
    log = os.open(home / "worker.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ["ATTUNE_HOME"] = str(home / "attune")
    os.environ["PREFECT_HOME"] = str(home / "prefect")
    _share_gate_work(Path(gate_cache or Path(base) / "gate"), home / "attune")
    if os.environ.get("MLFLOW_TRACKING_URI", "").startswith("sqlite") or "MLFLOW_TRACKING_URI" not in os.environ:
        os.environ.pop("MLFLOW_TRACKING_URI", None)   # the default: $ATTUNE_HOME/mlflow.db
    if prefect_api_url:
        os.environ["PREFECT_API_URL"] = prefect_api_url
    else:
        os.environ.pop("PREFECT_API_URL", None)        # an ephemeral API on this worker's own database
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")


def _share_gate_work(cache: Path, attune_home: Path) -> None:
    """The gate is deterministic in its inputs, so its work is shared by every worker: verdicts
    (attune.campaign.finish caches them by content under $ATTUNE_HOME/gate-cache) and proxy runs
    (gate.verify reuses identical runs from ATTUNE_PROXY_CACHE). Campaigns of different planners
    with the same recipe and seed then train the baseline replicates once; verdicts do not change."""
    shared = cache / "verdicts"
    shared.mkdir(parents=True, exist_ok=True)
    attune_home.mkdir(parents=True, exist_ok=True)
    link = attune_home / "gate-cache"
    if not link.exists():
        link.symlink_to(shared, target_is_directory=True)
    os.environ.setdefault("ATTUNE_PROXY_CACHE", str(cache / "proxy-runs"))


def run_cell(cell_json: str) -> dict[str, Any]:
    """Run one campaign and score it; never raises (a failed cell says why in `error`)."""
    from attune.bench.request import BenchCell

    cell = BenchCell.model_validate_json(cell_json)
    started = time.monotonic()
    row: dict[str, Any] = {"key": cell.key, "recipe": cell.recipe.label, "planner": cell.variant.label,
                           "seed": cell.seed, "gpus": cell.recipe.gpus,
                           "budget_gpu_hours": cell.recipe.budget_gpu_hours, "error": None}
    try:
        result = _campaign(cell)
        row |= score_campaign(cell, result)
    except Exception as err:  # noqa: BLE001 - a cell's failure is data for the report, not a crash
        from attune.errors import InputError
        row["error"] = str(err) if isinstance(err, InputError) else f"{type(err).__name__}: {err}"
    finally:
        _drop_campaign_evidence()
    row["seconds"] = time.monotonic() - started
    return row


def _campaign(cell) -> dict[str, Any]:
    from flows.campaign import tune_campaign

    return tune_campaign(cell.recipe.path, cell.recipe.budget_gpu_hours, stack="sim", planner=cell.variant.planner,
                         cluster=cell.recipe.cluster, seed=cell.seed, steps_per_trial=cell.steps_per_trial,
                         replicates=cell.replicates, disabled_rules=list(cell.variant.disabled_rules),
                         gate_steps=cell.gate_steps, gate_seed=cell.gate_seed, model_spec=cell.recipe.model_spec,
                         quiet=True)


def _drop_campaign_evidence() -> None:
    from lessons.catalog import user_evidence_file
    user_evidence_file().unlink(missing_ok=True)


def score_campaign(cell, result: dict[str, Any]) -> dict[str, Any]:
    """The campaign's result plus its ground-truth score and its incumbent trajectory (each point
    the ground-truth gain of what the campaign would ship if it stopped there)."""
    from attune.bench.trajectory import shipped_trajectory
    from attune.bench.truth import truth_tps
    from attune.campaign.state import CampaignState
    from flows.campaign import load_campaign_recipe

    recipe = load_campaign_recipe(cell.recipe.path, cell.recipe.cluster, cell.recipe.model_spec)
    state = CampaignState.load(Path(result["campaign_dir"]) / "state.json")
    baseline_levers = recipe.layout().levers()
    shipped_levers = result["best"]["levers"] if result["shipped"] else baseline_levers
    cache: dict[str, float] = {}

    def tps(levers: dict) -> float:
        key = repr(sorted(levers.items()))
        if key not in cache:
            cache[key] = truth_tps(recipe, levers)
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
