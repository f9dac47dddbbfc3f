"""The worker processes benchmark campaigns run in: each runs the real campaign flow
(flows/campaign.py) on the sim stack, then has it scored on the ground truth (attune/bench/score.py).

Spawned (not forked) so each worker imports Prefect and MLflow after init_worker has pointed them
at that worker's own homes; the pool outlives the cells so each worker starts its Prefect API once.
Each worker process has its own ATTUNE_HOME, PREFECT_HOME and MLflow SQLite file, so two campaigns
never write one SQLite file. Lessons evidence a campaign appends is dropped before the next one:
every benchmark campaign starts from the shipped catalog, so seeds are independent and the order
cells run in does not matter.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

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
    from attune.bench.score import score_campaign

    cell = BenchCell.model_validate_json(cell_json)
    started = time.monotonic()
    row: dict[str, Any] = {"key": cell.key, "recipe": cell.recipe.label, "planner": cell.variant.label,
                           "seed": cell.seed, "cluster_seed": cell.cluster_seed, "world": cell.world,
                           "gpus": cell.recipe.gpus,
                           "budget_gpu_hours": cell.recipe.budget_gpu_hours, "error": None}
    try:
        result = _campaign(cell)
        row |= score_campaign(cell, result)
    except Exception as err:  # noqa: BLE001 - a cell's failure is data for the report, not a crash
        from attune.errors import InputError
        row["error"] = str(err) if isinstance(err, InputError) else f"{type(err).__name__}: {err}"
    finally:
        _drop_campaign_ledger()
    row["seconds"] = time.monotonic() - started
    return row


def _campaign(cell) -> dict[str, Any]:
    from attune.flows.campaign import tune_campaign

    return tune_campaign(cell.path, cell.settings(), cluster=cell.cluster, model_spec=cell.recipe.model_spec,
                         quiet=True)


def _drop_campaign_ledger() -> None:
    """Cells are independent campaigns: none may learn from the lessons ledger another cell wrote
    (each worker has its own ATTUNE_HOME, so its own default store)."""
    from attune.lessons.ledger import PREFIX
    from attune.store import store_location
    kind, where, _ = store_location(None)
    if kind == "folder":
        shutil.rmtree(Path(where) / PREFIX, ignore_errors=True)


_POOL: ProcessPoolExecutor | None = None


def default_workers() -> int:
    """One worker per core the process may use (2 on the shared development machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def open_pool(workers: int, homes: Path, prefect_api_url: str | None = None,
              gate_cache: Path | None = None) -> ProcessPoolExecutor:
    global _POOL
    close_pool()
    homes.mkdir(parents=True, exist_ok=True)
    _POOL = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                initializer=init_worker,
                                initargs=(str(homes), prefect_api_url, str(gate_cache) if gate_cache else None))
    return _POOL


def current_prefect_api() -> str | None:
    """The API this process's flow runs talk to: PREFECT_API_URL, or the ephemeral server Prefect
    started for this process (so workers report to it instead of starting servers of their own)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if url:
        return url
    try:
        from prefect.server.api.server import SubprocessASGIServer
        server = SubprocessASGIServer()
        return server.api_url if server.running else None
    except Exception:  # noqa: BLE001 - an internal of Prefect's; without it workers start their own
        return None


def submit(function, *args) -> Future:
    if _POOL is None:
        raise RuntimeError("open_pool() first")
    return _POOL.submit(function, *args)


def submit_cell(cell_json: str) -> Future:
    return submit(run_cell, cell_json)


def close_pool() -> None:
    global _POOL
    if _POOL is not None:
        _POOL.shutdown(wait=True, cancel_futures=True)
        _POOL = None
