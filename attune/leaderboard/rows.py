"""TrainingThroughputBench rows: the best verified recipe per model and cluster, from the committed
seed board (the repo's leaderboard/ folder, itself a folder store) merged with the configured store."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from attune.levers import Scalar
from attune.store import StoreEntry, open_store, rank

TITLE = "TrainingThroughputBench"
# The seed board ships in the repository next to the package (an editable install finds it);
# where it is absent (a wheel install) the board is the configured store alone.
SEED_DIR = Path(__file__).resolve().parents[2] / "leaderboard"


class BoardRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int  # within the model
    model: str
    accelerator: str
    gpus: int
    gpus_per_node: int
    cluster: str
    levers: dict[str, Scalar]
    tokens_per_sec_per_gpu: float
    mfu: float | None
    step_time_s: float | None
    peak_memory_gib: float | None
    cost_per_million_tokens: float
    gate_passed: bool
    simulated: bool
    measured_on: str  # "simulator" or "hardware": the label md and html show
    stack: dict[str, str]
    stack_fingerprint: str
    measured_at: str
    mlflow_run_id: str | None
    source: str  # "seed" (committed board) or "store"


class Board(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = TITLE
    generated_at: str
    sources: list[str]
    rows: list[BoardRow]


def best_rows(entries: list[tuple[StoreEntry, str]], model: str | None = None) -> list[BoardRow]:
    """Verified entries only; per (model, accelerator, GPU count) the best by store rank, across stacks.

    Sorted by model, then throughput per GPU (highest first), then cost (lowest first).
    """
    best: dict[tuple[str, str, int], tuple[StoreEntry, str]] = {}
    for entry, source in entries:
        if not entry.gate_passed or (model is not None and entry.model != model):
            continue
        group = (entry.model, entry.accelerator, entry.gpus)
        held = best.get(group)
        # On equal rank the configured store beats the seed: it is the newer, local evidence.
        if held is None or (rank(entry), source == "store") > (rank(held[0]), held[1] == "store"):
            best[group] = (entry, source)
    ordered = sorted(best.values(), key=lambda pair: (pair[0].model, -pair[0].tokens_per_sec_per_gpu,
                                                      pair[0].cost_per_million_tokens))
    rows, places = [], {}
    for entry, source in ordered:  # rank counts within a model: 1 is its fastest cluster
        places[entry.model] = places.get(entry.model, 0) + 1
        rows.append(_row(places[entry.model], entry, source))
    return rows


def _row(position: int, entry: StoreEntry, source: str) -> BoardRow:
    return BoardRow(
        rank=position, model=entry.model, accelerator=entry.accelerator, gpus=entry.gpus,
        gpus_per_node=entry.gpus_per_node, cluster=entry.cluster_label, levers=entry.levers,
        tokens_per_sec_per_gpu=entry.tokens_per_sec_per_gpu, mfu=entry.mfu, step_time_s=entry.step_time_s,
        peak_memory_gib=entry.peak_memory_gib, cost_per_million_tokens=entry.cost_per_million_tokens,
        gate_passed=entry.gate_passed, simulated=entry.simulated,
        measured_on="simulator" if entry.simulated else "hardware", stack=entry.stack,
        stack_fingerprint=entry.stack_fingerprint, measured_at=entry.measured_at,
        mlflow_run_id=entry.mlflow_run_id, source=source)


def load_board(store_uri: str | None = None, model: str | None = None,
               seed_dir: Path | str | None = SEED_DIR) -> Board:
    """The board shown by `attune leaderboard`: seed folder (None: no seed) merged with the store."""
    entries: list[tuple[StoreEntry, str]] = []
    sources = []
    if seed_dir is not None and Path(seed_dir).is_dir():
        seed = open_store(str(seed_dir))
        entries += [(entry, "seed") for entry in seed.list()]
        sources.append(seed.location)
    store = open_store(store_uri)
    entries += [(entry, "store") for entry in store.list()]
    sources.append(store.location)
    return Board(generated_at=datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
                 sources=sources, rows=best_rows(entries, model))


def board_json(board: Board) -> dict[str, Any]:
    return board.model_dump(mode="json")
