"""What a campaign carries over from an earlier one (a warm start, attune.campaign.warm_start): the
earlier campaign's layouts and runs, and the map fitted from the layouts measured in both. Saved in
the campaign's state, so a resume keeps it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from attune.campaign.costs import MeasuredRun


class OldLayout(BaseModel):
    """One layout the earlier campaign measured: its mean throughput and peak memory, or that it OOMed."""
    levers: dict[str, Any]
    tps: float | None = None          # mean tokens/s/GPU of its successful runs (None: none succeeded)
    peak_memory_gib: float | None = None
    oom: bool = False


class RankMap(BaseModel):
    """How the re-measured layouts compare with what the earlier campaign measured of them."""
    scale: float                      # mean log(new / old)
    pairs: int                        # layouts measured in both
    stray: float                      # the largest |log(new / old) - scale|
    tolerance: float                  # what noise allows of it
    holds: bool
    why: str


class WarmStart(BaseModel):
    """What a campaign carries over from an earlier one (saved in its state: a resume keeps it)."""
    source: str                       # the earlier campaign's folder name
    memory_gib: float                 # the earlier cluster's memory per GPU
    noise_sd: float                   # its run-to-run log sd (its baseline's)
    spread: tuple[float, int] | None = None   # its run-to-run log sd pooled over every layout it ran twice, dof
    shipped: dict[str, Any] | None = None
    layouts: list[OldLayout] = []     # best first
    runs: list[MeasuredRun] = []      # its runs of those layouts: their start-ups price this campaign's first
    remeasure: list[dict[str, Any]] = []
    map: RankMap | None = None

    def summary(self) -> str:
        if self.map is None:
            return f"warm start from {self.source}: {len(self.layouts)} old layouts, re-measuring {len(self.remeasure)}"
        return f"warm start from {self.source}: {self.map.why}"
