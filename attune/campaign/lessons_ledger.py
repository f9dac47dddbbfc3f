"""A campaign and the lessons ledger (attune.lessons.ledger): what it reads at its start, what it
writes when it finishes.

A new campaign reads the ledger of the recipe store once and keeps that copy in its folder
(ledger.json), so a resumed campaign plans from the same evidence however many campaigns finished
meanwhile. A finished campaign writes its moves as one object; a resumed one that had written them
before its kill replaces them.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from attune.files import atomic_write_text
from attune.lessons import ledger
from attune.lessons.ledger import CampaignMoves, Context
from attune.recipe import Recipe

SNAPSHOT = "ledger.json"


def context_of(recipe: Recipe, stack_kind: str) -> Context:
    stack = recipe.stack
    return Context.of(recipe.architecture.is_moe, recipe.architecture.total_params, recipe.cluster.accelerator,
                      recipe.cluster.gpus, f"{stack_kind} torchtitan {stack.torchtitan} torch {stack.torch}")


def read_store(store_uri: str | None) -> list[CampaignMoves]:
    """The ledger as the recipe store holds it now (the default store where `store_uri` is None)."""
    from attune.store import open_store
    entries, _unreadable = ledger.read(open_store(store_uri).blobs)
    return entries


def keep_snapshot(directory: Path, entries: list[CampaignMoves]) -> None:
    atomic_write_text(directory / SNAPSHOT, json.dumps([e.model_dump(mode="json") for e in entries]))


def load_snapshot(directory: Path) -> list[CampaignMoves]:
    """The copy a campaign took at its start; none for a campaign started before the ledger existed."""
    path = directory / SNAPSHOT
    if not path.is_file():
        return []
    return [CampaignMoves.model_validate(row) for row in json.loads(path.read_text())]


def record(c, store_uri: str | None) -> int:
    """Write the campaign's moves to the ledger once; the number written. `c` is a campaign
    (attune.campaign.context.Campaign)."""
    from attune.store import open_store
    if c.state.lessons_recorded:
        return 0
    moves = ledger.moves_of(c.state.trials, c.state.runs_by_layout(), c.state.noise_rel_sd or 0.0)
    if moves:
        ledger.write(open_store(store_uri).blobs, CampaignMoves(
            campaign=c.state.campaign_id, at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            model=c.recipe.model_name, context=context_of(c.recipe, c.settings.stack), moves=moves))
    c.state.lessons_recorded = True
    c.save()
    return len(moves)
