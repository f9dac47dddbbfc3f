"""The memory model's Megatron pipeline split, checked against the split's own arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from attune.sim.arrays import SCHEDULES, from_columns
from attune.sim.memory import _first_chunk_relief
from attune.sim.shapes import shapes
from attune.spec.model import catalog_model


def _megatron_stage_layers(L: int, pp: int, v: int) -> list[int]:
    """Decoder layers per pipeline rank under account_for_embedding/loss_in_pipeline_split: L + 2
    slots in pp·v equal chunks, rank r holding chunks r, r + pp, ...; the embedding takes a slot of
    the first chunk, the loss one of the last."""
    slots = (L + 2) // (pp * v)
    chunks = [slots - (c == 0) - (c == pp * v - 1) for c in range(pp * v)]
    return [sum(chunks[r::pp]) for r in range(pp)]


@pytest.mark.parametrize("L,pp,v", [(80, 2, 1), (94, 2, 1), (94, 4, 1), (94, 8, 1), (94, 2, 3), (94, 4, 3),
                                    (62, 8, 2), (30, 2, 8), (126, 4, 2)])
def test_megatron_first_chunk_relief_leaves_the_first_rank_its_split_share(L, pp, v):
    """The first rank holds `shapes.layers` (ceil(L / (pp·v))·v) less one layer per micro-batch on
    its first chunk, which is what Megatron's split gives it. With pp = 2 and one chunk per rank
    ceil(L / 2) already is the first rank's (L + 2) / 2 - 1: there is no layer left to take off."""
    assert (L + 2) % (pp * v) == 0
    model = catalog_model("llama3.1-70b").model_copy(update={"n_layers": L})
    sched = SCHEDULES.index("Interleaved1F1B" if v > 1 else "1F1B")
    m = 4 * pp                                            # enough micro-batches to fill the warm-up
    la = from_columns(tp=1, pp=pp, cp=1, ep=1, dpr=1, dps=8, lb=m, gbs=8 * m, seq=4096, sched=sched, mb=1,
                      ac=0, comp=0, f8=0, v=v)
    sh = shapes(model, la, 0.0)
    stages = _megatron_stage_layers(L, pp, v)
    on_first_chunk = 2 * pp - 1 if v > 1 else pp
    relief = _first_chunk_relief(model, la, sh)
    assert relief[0] == (sh.layers[0] - stages[0]) * on_first_chunk


def test_no_relief_where_megatron_would_refuse_the_split():
    model = catalog_model("llama3.1-70b")                 # 80 + 2 layers: no even split over 4 ranks
    la = from_columns(tp=1, pp=4, cp=1, ep=1, dpr=1, dps=8, lb=16, gbs=128, seq=4096, sched=0, mb=1,
                      ac=0, comp=0, f8=0)
    assert np.all(_first_chunk_relief(model, la, shapes(model, la, 0.0)) == 0)
