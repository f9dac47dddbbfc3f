"""The lessons ledger: what every finished campaign measured for each move it tried, in the recipe store.

One object per campaign, `lessons/ledger/<campaign id>.json`, written whole when the campaign
finishes: a campaign counts once however often it is resumed, two campaigns never write the same
object, and the local folder and S3 back ends (attune.store) behave alike. A row is one layout the
search measured against the incumbent it moved from: which levers changed, the incumbent's
symptoms, and the measured gain with its noise. What a row is worth to a lesson in another
campaign's context is attune.lessons.posterior's business.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Literal

from pydantic import BaseModel, ValidationError

from attune.levers import Scalar, layout_key
from attune.store.base import stored

PREFIX = "lessons/ledger/"
SIZE_CLASSES = ((1e9, "<1B"), (10e9, "1-10B"), (100e9, "10-100B"), (math.inf, "100B+"))   # total parameters
GPU_CLASSES = ((8, "1-8"), (63, "9-63"), (256, "64-256"), (math.inf, "257+"))


class Context(BaseModel):
    """Where a campaign ran: what decides whether its measurements speak for another campaign."""
    family: Literal["moe", "dense"]
    size: str            # SIZE_CLASSES
    accelerator: str
    gpus: str            # GPU_CLASSES
    stack: str           # the stack kind and its versions, e.g. "torchtitan 0.3.1 torch 2.9.0"

    @classmethod
    def of(cls, is_moe: bool, total_params: float, accelerator: str, gpus: int, stack: str) -> "Context":
        return cls(family="moe" if is_moe else "dense", size=_class(total_params, SIZE_CLASSES),
                   accelerator=accelerator, gpus=_class(gpus, GPU_CLASSES), stack=stack)

    def describe(self) -> str:
        return f"{'MoE' if self.family == 'moe' else 'dense'} {self.size} on {self.accelerator} at {self.gpus} GPUs"

    def mismatches(self, other: "Context") -> int:
        """Fields other than the family that differ (the family must match for a row to count at all)."""
        return sum(getattr(self, f) != getattr(other, f) for f in ("size", "accelerator", "gpus", "stack"))


def _class(value: float, classes: tuple) -> str:
    return next(name for bound, name in classes if value <= bound)


class Move(BaseModel):
    """One layout the search measured against the incumbent it moved from."""
    changes: dict[str, tuple[Scalar, Scalar]]   # lever -> (incumbent's value, the layout's)
    symptoms: list[str] = []                    # the incumbent's diagnosis when the move was chosen
    gain: float | None                          # mean throughput over the incumbent's, minus 1; None: it did not run
    sd: float                                   # log sd of that gain: the campaign's run-to-run noise over both means
    status: str = "ok"                          # the run's status when it did not run (oom, crash, ...)
    lesson: str | None = None                   # the lesson the planner cited, if any


class CampaignMoves(BaseModel):
    """The ledger's object for one finished campaign."""
    campaign: str
    at: str
    model: str
    context: Context
    moves: list[Move]


def key(campaign_id: str) -> str:
    return f"{PREFIX}{campaign_id}.json"


def write(blobs, entry: CampaignMoves) -> None:
    """Put one campaign's moves in the ledger (replacing what a killed run of it wrote)."""
    blobs.write(key(entry.campaign), entry.model_dump_json(indent=1).encode(), "application/json")


def read(blobs) -> tuple[list[CampaignMoves], list[str]]:
    """Every campaign in the ledger, and the keys of objects that could not be read as one (a ledger
    another version wrote, a file edited by hand): listed, never fatal to a campaign."""
    entries, unreadable = [], []
    for name, data in stored(blobs, PREFIX):
        try:
            entries.append(CampaignMoves.model_validate(json.loads(data)))
        except (ValidationError, ValueError):
            unreadable.append(name)
    return entries, unreadable


def moves_of(trials: list, runs: dict[tuple, list[float]], noise_rel_sd: float) -> list[Move]:
    """The rows of a campaign: every search trial against its parent (the incumbent it moved from),
    once per layout, each layout's gain from the mean of all its runs, confirmations too. `trials`
    are attune.campaign.state.TrialRecord, `runs` their throughputs per layout
    (CampaignState.runs_by_layout)."""
    rows: dict[tuple, Move] = {}
    for t in trials:
        if t.role != "trial" or t.parent is None:
            continue
        parent = trials[t.parent]
        changes = {k: (parent.levers.get(k), v) for k, v in t.levers.items() if parent.levers.get(k) != v}
        if not changes:
            continue
        mine, base = runs.get(layout_key(t.levers), []), runs.get(layout_key(parent.levers), [])
        ok = bool(mine) and bool(base)
        sd = noise_rel_sd * math.sqrt(1 / max(1, len(mine)) + 1 / max(1, len(base)))
        rows[(layout_key(t.levers), layout_key(parent.levers))] = Move(
            changes=changes, symptoms=[s.id for s in parent.diagnosis],
            gain=(statistics.mean(mine) / statistics.mean(base) - 1) if ok else None, sd=sd,
            status="ok" if ok else t.result.status.value, lesson=t.lesson_id)
    return list(rows.values())
