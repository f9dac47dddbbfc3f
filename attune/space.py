"""The lever space of one recipe: which values each speed lever may take, and every valid layout.

Objective fields (global batch, sequence length, optimizer, ...) stay as the recipe sets them.
The space is the same for every planner and for the oracle, so their results are comparable.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from attune.layout import (AC_MODE, COMPILE, CP, DP_REPLICATE, EP, FLOAT8, LOCAL_BATCH, PP, PP_MICROBATCH,
                           PP_SCHEDULE, TP, Layout, layout_violations, microbatch_rule, resolve_layout, with_layout)
from attune.levers import Scalar, lever
from attune.recipe import Recipe


def lever_domains(recipe: Recipe) -> dict[str, list[Scalar]]:
    """Candidate values per speed lever, already narrowed by what the model and cluster allow."""
    model, cluster, base = recipe.architecture, recipe.cluster, recipe.layout()
    gpus = cluster.gpus

    def ints(key: str, keep) -> list[int]:
        return [v for v in lever(key).values if gpus % v == 0 and keep(v)]

    domains: dict[str, list[Scalar]] = {
        TP: ints(TP, lambda v: model.n_heads % v == 0 and model.n_kv_heads % v == 0),
        PP: ints(PP, lambda v: v <= model.n_layers),
        CP: ints(CP, lambda v: v == 1 or base.seq_len % (v * lever(CP).seq_block) == 0),
        EP: ints(EP, lambda v: v == 1 or (model.is_moe and model.n_experts % v == 0)),
        DP_REPLICATE: ints(DP_REPLICATE, lambda v: True),
        LOCAL_BATCH: [v for v in lever(LOCAL_BATCH).values if base.global_batch % v == 0],
        PP_SCHEDULE: list(lever(PP_SCHEDULE).values),
        PP_MICROBATCH: list(lever(PP_MICROBATCH).values),
        AC_MODE: list(lever(AC_MODE).values),
        COMPILE: list(lever(COMPILE).values),
        FLOAT8: list(lever(FLOAT8).values) if cluster.part.supports_float8 else ["none"],
    }
    # The recipe as written is a point of its own space, even where it sets a value the catalog does
    # not list (deepseek_v3_671b_pp16 runs a rank's 128 samples as one pipeline flush: local batch 128).
    own = base.levers()
    for key in (TP, PP, CP, EP, DP_REPLICATE, LOCAL_BATCH, PP_MICROBATCH):
        if own[key] not in domains[key]:
            domains[key] = sorted([*domains[key], own[key]])
    for key, allowed in recipe.search.items():   # the recipe's [search] narrows a domain, in catalog order
        if key in domains:
            domains[key] = [v for v in domains[key] if v in allowed]
    domains[PP] = [v for v in domains[PP] if v == 1 or _pipeline_fits(v, domains)]
    return domains


def _pipeline_fits(pp: int, d: dict[str, list[Scalar]]) -> bool:
    """Whether some schedule, local batch and micro-batch size of the domains give `pp` stages a
    pipeline micro-batch count its schedule accepts (layout_violations checks each layout)."""
    return any(local % mb == 0 and ((rule := microbatch_rule(schedule)) is None or rule.ok(local // mb, pp))
               for schedule in d[PP_SCHEDULE] for local in d[LOCAL_BATCH] for mb in d[PP_MICROBATCH])


def iter_layouts(recipe: Recipe) -> Iterator[Layout]:
    """Every valid layout of the recipe's lever space (pipeline-only levers only vary when pp > 1)."""
    model, cluster, base = recipe.architecture, recipe.cluster, recipe.layout()
    d = lever_domains(recipe)
    for tp, pp, cp, ep, dpr in itertools.product(d[TP], d[PP], d[CP], d[EP], d[DP_REPLICATE]):
        rest, rem = divmod(cluster.gpus, tp * pp * cp * dpr)
        if rem or rest < 1:
            continue
        pipeline = itertools.product(d[PP_SCHEDULE], d[PP_MICROBATCH]) if pp > 1 else [("1F1B", 1)]
        for (schedule, mb), local, ac, comp, f8 in itertools.product(
                pipeline, d[LOCAL_BATCH], d[AC_MODE], d[COMPILE], d[FLOAT8]):
            layout = with_layout(base, tp=tp, pp=pp, cp=cp, ep=ep, dp_replicate=dpr, dp_shard=rest,
                                 local_batch=local, pp_schedule=schedule, pp_microbatch=mb, ac_mode=ac,
                                 compile=comp, float8=f8)
            if not layout_violations(layout, model, cluster):
                yield layout


def config_for(recipe: Recipe, levers: dict[str, Scalar]) -> dict[str, Scalar]:
    """The full config of the recipe with these lever values, its global batch pinned to the
    recipe's own effective value (the objective never moves)."""
    config = dict(recipe.config) | dict(levers)
    config["training.global_batch_size"] = recipe.layout().global_batch
    return config


def recipe_at(recipe: Recipe, levers: dict[str, Scalar], name: str | None = None) -> Recipe:
    """The recipe moved to these lever values (its objective untouched), optionally renamed."""
    return recipe.with_config(config_for(recipe, levers), name=name)


def layout_of(recipe: Recipe, levers: dict[str, Scalar], check: bool = True) -> Layout:
    """The layout the recipe takes with these lever values (InputError if invalid; with check=False
    a layout that does not divide is still resolved, for reporting what was measured)."""
    return resolve_layout(config_for(recipe, levers), recipe.architecture, recipe.cluster, check=check)
