"""Layouts as numpy columns: the step model evaluates thousands of layouts in one pass.

Choice levers are stored as indices into the lever catalog's value tuples (SCHEDULES, AC_MODES,
FLOAT8_MODES), so a code means the same thing here, in attune/layout.py and in the TOML data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from attune.layout import AC_MODE, FLOAT8, INTERLEAVED_SCHEDULES, PP_SCHEDULE, Layout
from attune.levers import lever

SCHEDULES: tuple[str, ...] = tuple(lever(PP_SCHEDULE).values)
AC_MODES: tuple[str, ...] = tuple(lever(AC_MODE).values)
FLOAT8_MODES: tuple[str, ...] = tuple(lever(FLOAT8).values)
INTERLEAVED_CODES = np.array([s in INTERLEAVED_SCHEDULES for s in SCHEDULES])


@dataclass(frozen=True)
class LayoutArrays:
    """One entry per layout. `v` (stages per rank) and `async_tp` default from the schedule / off."""

    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    dpr: np.ndarray
    dps: np.ndarray
    lb: np.ndarray          # local batch (samples per data-parallel rank per micro-step)
    gbs: np.ndarray         # global batch
    seq: np.ndarray
    sched: np.ndarray       # index into SCHEDULES
    mb: np.ndarray          # pipeline micro-batch size
    ac: np.ndarray          # index into AC_MODES
    comp: np.ndarray        # bool
    f8: np.ndarray          # index into FLOAT8_MODES
    v: np.ndarray           # stages per pipeline rank
    async_tp: np.ndarray    # bool

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    def take(self, index) -> "LayoutArrays":
        return LayoutArrays(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def layout(self, i: int) -> Layout:
        return Layout(tp=int(self.tp[i]), pp=int(self.pp[i]), cp=int(self.cp[i]), ep=int(self.ep[i]),
                      dp_replicate=int(self.dpr[i]), dp_shard=int(self.dps[i]), local_batch=int(self.lb[i]),
                      global_batch=int(self.gbs[i]), seq_len=int(self.seq[i]),
                      pp_schedule=SCHEDULES[int(self.sched[i])], pp_microbatch=int(self.mb[i]),
                      ac_mode=AC_MODES[int(self.ac[i])], compile=bool(self.comp[i]),
                      float8=FLOAT8_MODES[int(self.f8[i])])

    def with_async_tp(self, on: bool) -> "LayoutArrays":
        return replace(self, async_tp=np.full(len(self), bool(on)) & self.comp & (self.tp > 1))


def stages_per_rank(pp: np.ndarray, sched: np.ndarray) -> np.ndarray:
    """attune.layout.Layout.stages_per_rank, vectorised: 2 for interleaved schedules with pp > 1."""
    return np.where((pp > 1) & INTERLEAVED_CODES[sched], 2, 1)


def from_columns(**cols) -> LayoutArrays:
    """Build from integer columns; v and async_tp are derived when absent."""
    n = len(np.atleast_1d(cols["tp"]))
    out = {k: v if isinstance(v, np.ndarray) and v.shape == (n,) else np.broadcast_to(np.asarray(v), (n,)).copy()
           for k, v in cols.items()}
    out.setdefault("v", stages_per_rank(out["pp"], out["sched"]))
    out.setdefault("async_tp", np.zeros(n, dtype=bool))
    out["comp"] = out["comp"].astype(bool)
    out["async_tp"] = out["async_tp"].astype(bool)
    return LayoutArrays(**out)


def from_layouts(layouts: Sequence[Layout], async_tp: bool = False) -> LayoutArrays:
    rows = list(layouts)
    col = lambda get, dtype=np.int64: np.array([get(x) for x in rows], dtype=dtype)  # noqa: E731
    arrays = from_columns(
        tp=col(lambda x: x.tp), pp=col(lambda x: x.pp), cp=col(lambda x: x.cp), ep=col(lambda x: x.ep),
        dpr=col(lambda x: x.dp_replicate), dps=col(lambda x: x.dp_shard), lb=col(lambda x: x.local_batch),
        gbs=col(lambda x: x.global_batch), seq=col(lambda x: x.seq_len),
        sched=col(lambda x: SCHEDULES.index(x.pp_schedule)), mb=col(lambda x: x.pp_microbatch),
        ac=col(lambda x: AC_MODES.index(x.ac_mode)), comp=col(lambda x: x.compile, bool),
        f8=col(lambda x: FLOAT8_MODES.index(x.float8)))
    return arrays.with_async_tp(async_tp) if async_tp else arrays
