"""The lever space of a recipe as numpy columns: attune.space.iter_layouts, vectorised.

Same domains (attune.space.lever_domains), same order, same validity rules as
attune.layout.layout_violations (tests/test_sim_space.py checks the sets are equal), but a
256-GPU MoE space of millions of candidates is built and filtered in a second instead of minutes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from attune.layout import (AC_MODE, COMPILE, CP, DP_REPLICATE, EP, FLOAT8, LOCAL_BATCH, PP, PP_MICROBATCH,
                           PP_SCHEDULE, TP, microbatch_rule)
from attune.levers import lever
from attune.recipe import Recipe
from attune.sim.arrays import AC_MODES, FLOAT8_MODES, SCHEDULES, LayoutArrays, from_columns, stages_per_rank
from attune.space import lever_domains


# Choice and bool levers as LayoutArrays columns: the column and the code a value has there.
_COLUMNS = {COMPILE: ("comp", bool), AC_MODE: ("ac", AC_MODES.index), FLOAT8: ("f8", FLOAT8_MODES.index)}


def _inner_grid(d: dict, piped: bool) -> dict[str, np.ndarray]:
    """Every (schedule, micro-batch, local batch, AC, compile, float8) row in product order."""
    pipeline = itertools.product(d[PP_SCHEDULE], d[PP_MICROBATCH]) if piped else [("1F1B", 1)]
    rows = [(SCHEDULES.index(s), mb, lb, AC_MODES.index(ac), bool(c), FLOAT8_MODES.index(f8))
            for (s, mb), lb, ac, c, f8 in itertools.product(pipeline, d[LOCAL_BATCH], d[AC_MODE], d[COMPILE], d[FLOAT8])]
    cols = np.array(rows, dtype=np.int64).reshape(-1, 6)
    return {k: cols[:, i] for i, k in enumerate(("sched", "mb", "lb", "ac", "comp", "f8"))}


def _degrees(recipe: Recipe, d: dict) -> np.ndarray:
    """(tp, pp, cp, ep, dpr, dps) rows whose product with dp_shard fills the cluster."""
    gpus = recipe.cluster.gpus
    rows = []
    for tp, pp, cp, ep, dpr in itertools.product(d[TP], d[PP], d[CP], d[EP], d[DP_REPLICATE]):
        rest, rem = divmod(gpus, tp * pp * cp * dpr)
        if not rem and rest >= 1:
            rows.append((tp, pp, cp, ep, dpr, rest))
    return np.array(rows, dtype=np.int64).reshape(-1, 6)


def valid_mask(recipe: Recipe, la: LayoutArrays) -> np.ndarray:
    """layout_violations(...) == [] for every row, vectorised (world size holds by construction)."""
    model, cluster = recipe.architecture, recipe.cluster
    ok = (la.tp >= 1) & (la.pp >= 1) & (la.cp >= 1) & (la.ep >= 1) & (la.dpr >= 1) & (la.lb >= 1) & (la.mb >= 1)
    ok &= (la.seq >= 1) & (la.dps >= 1) & (la.dpr * la.dps * la.cp * la.tp * la.pp == cluster.gpus)
    ok &= (model.n_heads % la.tp == 0) & (model.n_kv_heads % la.tp == 0)
    ok &= la.pp * stages_per_rank(la.pp, la.sched) <= model.n_layers
    ok &= (la.pp == 1) | (la.lb % la.mb == 0)
    for code, schedule in enumerate(SCHEDULES):   # the schedule's micro-batch rule (attune.layout.MICROBATCH_RULES)
        rule = microbatch_rule(schedule)
        if rule is not None:
            ok &= (la.pp == 1) | (la.sched != code) | rule.ok(la.lb // np.maximum(la.mb, 1), la.pp)
        for key, value in lever(PP_SCHEDULE).excludes.get(schedule, {}).items():   # values it cannot run with
            column, code_of = _COLUMNS[key]
            ok &= (la.pp == 1) | (la.sched != code) | (getattr(la, column) != code_of(value))
    ok &= (la.seq % la.cp == 0) & ((la.cp == 1) | (la.seq % (la.cp * lever(CP).seq_block) == 0))
    if model.is_moe:
        ok &= (la.ep == 1) | ((model.n_experts % la.ep == 0) & ((la.dps * la.cp * la.tp) % la.ep == 0))
    else:
        ok &= la.ep == 1
    per_step = la.lb * la.dpr * la.dps
    ok &= (la.gbs >= per_step) & (la.gbs % per_step == 0)
    if not cluster.part.supports_float8:
        ok &= la.f8 == 0
    return ok


def iter_space(recipe: Recipe, max_rows: int = 250_000) -> Iterator[LayoutArrays]:
    """The valid layouts in chunks of at most ~max_rows candidates, in iter_layouts order."""
    base, d = recipe.layout(), lever_domains(recipe)
    inner = {False: _inner_grid(d, False), True: _inner_grid(d, True)}
    degrees = _degrees(recipe, d)
    start = 0
    while start < len(degrees):
        rows, stop = 0, start
        while stop < len(degrees) and (rows == 0 or rows + len(inner[degrees[stop, 1] > 1]["lb"]) <= max_rows):
            rows += len(inner[degrees[stop, 1] > 1]["lb"])
            stop += 1
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("tp", "pp", "cp", "ep", "dpr", "dps", "sched", "mb",
                                                              "lb", "ac", "comp", "f8")}
        for row in degrees[start:stop]:
            grid = inner[row[1] > 1]
            n = len(grid["lb"])
            for k, v in zip(("tp", "pp", "cp", "ep", "dpr", "dps"), row):
                cols[k].append(np.full(n, v, dtype=np.int64))
            for k, v in grid.items():
                cols[k].append(v)
        joined = {k: np.concatenate(v) for k, v in cols.items()}
        n = len(joined["tp"])
        la = from_columns(**joined, gbs=np.full(n, base.global_batch), seq=np.full(n, base.seq_len))
        keep = valid_mask(recipe, la)
        if keep.any():
            yield la.take(keep)
        start = stop


def space_arrays(recipe: Recipe) -> LayoutArrays:
    """Every valid layout of the recipe's lever space, as one LayoutArrays."""
    chunks = list(iter_space(recipe, max_rows=10**9))
    if not chunks:
        return from_columns(**{k: np.zeros(0, dtype=np.int64) for k in
                               ("tp", "pp", "cp", "ep", "dpr", "dps", "lb", "gbs", "seq", "sched", "mb", "ac", "comp", "f8")})
    return chunks[0]


__all__ = ["iter_space", "space_arrays", "valid_mask"]
