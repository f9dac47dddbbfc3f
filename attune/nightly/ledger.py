"""What each night decided for each registered recipe, kept in the recipe store beside the recipes.

The store only ever holds shipped (gated) recipes. When a campaign on a new stack keeps the
baseline, nothing new is shipped, so the store alone would say "the stack changed" again every
night and re-spend the budget; the ledger remembers that this stack was already tuned.

    nightly/<recipe>/latest.json    the last night's record (read by the next night)
    nightly/<recipe>/<night>.json   one record per night (history)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from attune.nightly.regression import Remeasure
from attune.store import RecipeStore
from attune.store.entry import now_iso

Action = Literal["none", "tuned", "failed"]


class OpenRegression(BaseModel):
    """A slowdown no gated recipe has fixed yet; the nightly run stays failed while it stands."""
    since: str                     # the night it was first measured
    fingerprint: str               # on this stack
    change: float                  # tonight's measured change vs the shipped throughput (negative)
    retuned_night: str | None      # the night a campaign tried to fix it on this stack, if one did


class NightRecord(BaseModel):
    recipe: str
    night: str
    model: str
    cluster: str
    fingerprint: str
    stack: dict[str, str]
    reference: dict[str, Any] | None = None   # attune.nightly.decide.Reference, as a dict
    changes: list[str] = []
    remeasure: Remeasure | None = None
    action: Action = "none"
    why: str = ""
    campaign: dict[str, Any] | None = None    # the campaign's result (shipped, gain, mlflow_run_id, ...)
    error: str | None = None
    open_regression: OpenRegression | None = None
    tuned_fingerprint: str | None = None      # the stack the last campaign (any night) tuned on
    tuned_stack: dict[str, str] | None = None
    tuned_at: str | None = None               # when that campaign finished (ISO time)
    flow_run_id: str | None = None
    at: str = ""

    @property
    def failed(self) -> bool:
        return self.open_regression is not None or self.error is not None


def _key(recipe: str, name: str) -> str:
    return f"nightly/{recipe}/{name}.json"


def last_record(store: RecipeStore, recipe: str) -> NightRecord | None:
    found = store.blobs.read(_key(recipe, "latest"))
    return NightRecord.model_validate_json(found[0]) if found else None


def write_record(store: RecipeStore, record: NightRecord) -> NightRecord:
    record = record.model_copy(update={"at": record.at or now_iso()})
    data = record.model_dump_json(indent=1).encode()
    store.put_blob(_key(record.recipe, record.night), data)
    store.put_blob(_key(record.recipe, "latest"), data)  # one nightly per recipe at a time: last wins
    return record
