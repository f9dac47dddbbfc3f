"""The worker processes benchmark campaigns run in.

Spawned (not forked) so each worker imports Prefect and MLflow after init_worker has pointed them
at that worker's own homes; the pool outlives the cells so each worker starts its Prefect API once.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

from attune.bench.cell import init_worker, run_cell

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
