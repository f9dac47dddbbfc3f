"""A lesson's prior for a new campaign: its catalog figure updated by the ledger's matching evidence.

On the log scale of throughput, the catalog's expected gain is a normal prior whose sd is its own
size (at least MIN_WIDTH: a guess is not a measurement). Each earlier campaign that made the
lesson's move alone (its lever, changed the lesson's way, and no other lever but the data-parallel
shard degree, which takes what the others leave of the world size) from an incumbent of the same
model family is one normal observation, whatever the number of its rows: its mean measured gain,
with a variance of its own noise plus BETWEEN (campaigns of one context differ) plus EXTRA for
every context field that differs from this campaign's (size class, accelerator, GPU count class,
stack) and for an incumbent without the lesson's symptoms. A layout that moved several levers
says nothing about one of them (on the CPU sweeps a first move of three levers measured +121%, and
counted for each lever it made every lesson look like a win). The posterior is the conjugate
normal update: a lesson that campaigns like this one found useless sinks below zero and is tried
later, one they found worth more is tried sooner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attune.lessons.catalog import Lesson
from attune.lessons.ledger import CampaignMoves, Context, Move
from attune.levers import Scalar, lever

MIN_WIDTH = 0.05    # the least log sd of the catalog's figure
BETWEEN = 0.05      # log sd a move's gain varies by between campaigns of one context
EXTRA = 0.05        # log sd added per context field that differs, and for other symptoms
FOLLOWS = frozenset({"parallelism.data_parallel_shard_degree"})   # moves with the others: not a lever moved


@dataclass(frozen=True)
class Posterior:
    lesson: str
    mean: float                  # log of the expected throughput ratio
    sd: float
    campaigns: int               # earlier campaigns that made the move (rows that ran)
    failed: int = 0              # of the rows that made the move, those that did not run (OOM, crash)
    where: str = ""              # the contexts the evidence came from

    @property
    def gain(self) -> float:
        return math.expm1(self.mean)

    def text(self) -> str:
        if not self.campaigns:
            return f"lesson {self.lesson}: {self.gain:+.1%} ± {self.sd:.1%} (catalog; no campaign measured it yet)"
        failed = f", {self.failed} did not run" if self.failed else ""
        return (f"lesson {self.lesson}: {self.gain:+.1%} ± {self.sd:.1%} over {self.campaigns} "
                f"campaign{'s' * (self.campaigns != 1)} on {self.where}{failed}")


def makes_move(lesson: Lesson, move: Move) -> bool:
    """Is the measured move the lesson's move alone: its lever changed its way, nothing else moved
    (FOLLOWS aside)?"""
    key = lesson.try_.lever
    if key not in move.changes or set(move.changes) - FOLLOWS - {key}:
        return False
    before, after = move.changes[key]
    if lesson.try_.direction == "set":
        return after == lesson.try_.value and before != lesson.try_.value
    try:
        up = _order(key, after) > _order(key, before)
    except (ValueError, TypeError):
        return False
    return up if lesson.try_.direction == "up" else not up


def _order(key: str, value: Scalar) -> float:
    catalog = lever(key)
    return float(list(catalog.values).index(value)) if catalog.kind == "choice" else float(value)


def posterior(lesson: Lesson, ledger: list[CampaignMoves], context: Context | None) -> Posterior:
    """The lesson's prior for a campaign in `context` (None: every family, no context penalty, as
    `attune lessons` shows a lesson on its own)."""
    mean0 = math.log1p(lesson.expected_gain)
    precision, weighted = 1 / max(abs(mean0), MIN_WIDTH) ** 2, mean0 / max(abs(mean0), MIN_WIDTH) ** 2
    campaigns, failed, where = 0, 0, []
    for entry in ledger:
        if context is not None and entry.context.family != context.family:
            continue
        if lesson.when.model != "any" and entry.context.family != lesson.when.model:
            continue
        rows = [m for m in entry.moves if makes_move(lesson, m)]
        failed += sum(m.gain is None for m in rows)
        ran = [m for m in rows if m.gain is not None and m.gain > -1]
        if not ran:
            continue
        penalty = 0 if context is None else entry.context.mismatches(context)
        variances = [m.sd ** 2 + BETWEEN ** 2 + EXTRA ** 2 * (penalty + (not set(m.symptoms) & set(lesson.when.symptoms)))
                     for m in ran]
        y = sum(math.log1p(m.gain) for m in ran) / len(ran)   # rows of one campaign share its luck: one observation
        variance = min(variances)
        precision += 1 / variance
        weighted += y / variance
        campaigns += 1
        where.append(entry.context.describe())
    mean = weighted / precision
    return Posterior(lesson=lesson.id, mean=mean, sd=1 / math.sqrt(precision), campaigns=campaigns, failed=failed,
                     where=_summary(where))


def _summary(contexts: list[str]) -> str:
    counts: dict[str, int] = {}
    for c in contexts:
        counts[c] = counts.get(c, 0) + 1
    return "; ".join(f"{c}" + (f" ({n})" if len(counts) > 1 else "") for c, n in counts.items())
