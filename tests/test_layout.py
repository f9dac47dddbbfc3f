"""Layout rules and lever moves with their compensations."""

import numpy as np
import pytest

from attune.errors import InputError
from attune.layout import (DP_SHARD, GLOBAL_BATCH, LOCAL_BATCH, TP, apply_levers, resolve_layout)
from attune.spec import ClusterSpec, catalog_model

H100_8 = ClusterSpec(accelerator="h100", gpus=8)
H100_64 = ClusterSpec(accelerator="h100", gpus=64)
LLAMA8 = catalog_model("llama3.1-8b")
QWEN30 = catalog_model("qwen3-30b-a3b")


def test_dp_shard_takes_what_is_left_and_global_batch_defaults_to_local_times_dp():
    layout = resolve_layout({TP: 2, LOCAL_BATCH: 2}, LLAMA8, H100_8)
    assert (layout.dp_shard, layout.global_batch, layout.grad_accum) == (4, 8, 1)
    assert layout.world == 8


@pytest.mark.parametrize("config, field", [
    ({TP: 3}, TP),                                                # 3 does not divide 8 GPUs: tp is named
    ({DP_SHARD: 2}, DP_SHARD),                                    # world 2 != 8
    ({"parallelism.pipeline_parallel_degree": 8, "parallelism.pipeline_parallel_schedule": "Interleaved1F1B",
      "parallelism.pipeline_parallel_microbatch_size": 3, LOCAL_BATCH: 4}, "parallelism.pipeline_parallel_microbatch_size"),
    ({"parallelism.context_parallel_degree": 8, "training.seq_len": 1020}, "parallelism.context_parallel_degree"),
    ({"parallelism.expert_parallel_degree": 2}, "parallelism.expert_parallel_degree"),   # dense model
    ({GLOBAL_BATCH: 12, LOCAL_BATCH: 1}, LOCAL_BATCH),            # 12 not a multiple of 1 x 8
])
def test_invalid_layouts_name_the_field(config, field):
    with pytest.raises(InputError) as err:
        resolve_layout(config, LLAMA8, H100_8)
    assert err.value.field == field


def test_tp_must_divide_kv_heads():
    with pytest.raises(InputError) as err:
        resolve_layout({TP: 8}, QWEN30, H100_64)   # qwen3-30b-a3b has 4 kv heads
    assert err.value.field == TP and "n_kv_heads=4" in err.value.rule


def test_smaller_local_batch_raises_grad_accum_and_holds_global_batch():
    base = {LOCAL_BATCH: 4}
    moved = apply_levers(base, {LOCAL_BATCH: 1}, LLAMA8, H100_8)
    before, after = resolve_layout(base, LLAMA8, H100_8), resolve_layout(moved, LLAMA8, H100_8)
    assert after.global_batch == before.global_batch == 32
    assert (before.grad_accum, after.grad_accum) == (1, 4)
    assert moved[GLOBAL_BATCH] == 32


def test_shrinking_tp_grows_explicit_dp_shard_so_world_size_holds():
    base = {TP: 4, DP_SHARD: 2, LOCAL_BATCH: 1, GLOBAL_BATCH: 8}
    moved = apply_levers(base, {TP: 2}, LLAMA8, H100_8)
    assert moved[DP_SHARD] == 4
    after = resolve_layout(moved, LLAMA8, H100_8)
    assert after.world == 8 and after.global_batch == 8 and after.grad_accum == 2


def test_growing_tp_that_breaks_the_global_batch_is_refused():
    # global batch 4 = 1 x dp 4; tp 1 -> dp 8 would need global >= 8
    with pytest.raises(InputError):
        apply_levers({TP: 2, LOCAL_BATCH: 1}, {TP: 1}, LLAMA8, H100_8)


def test_objective_fields_cannot_be_moved():
    with pytest.raises(InputError) as err:
        apply_levers({}, {"training.seq_len": 4096}, LLAMA8, H100_8)
    assert "not a speed lever" in err.value.rule
    with pytest.raises(InputError):
        apply_levers({}, {"optimizer.lr": 1e-3}, LLAMA8, H100_8)


def test_context_parallel_needs_the_sequence_in_blocks_of_128_per_rank():
    # torch's CP FlexAttention refuses seq 128 at cp=2 ("Q_LEN 128 is not divisible by CP mesh world
    # size 2 * BLOCK_SIZE 128"); 256 runs (measured on the torchtitan CPU stack).
    cp = "parallelism.context_parallel_degree"
    with pytest.raises(InputError) as err:
        resolve_layout({cp: 2, "training.seq_len": 128}, LLAMA8, H100_8)
    assert err.value.field == cp and "cp x 128" in err.value.rule
    assert resolve_layout({cp: 2, "training.seq_len": 256}, LLAMA8, H100_8).cp == 2


def test_a_space_never_offers_context_parallelism_its_sequence_cannot_split():
    from attune.recipe import load_recipe
    from attune.space import iter_layouts, lever_domains
    recipe = load_recipe("recipes/cpu/llama3_debug.toml")      # seq_len 128
    assert lever_domains(recipe)["parallelism.context_parallel_degree"] == [1]
    assert all(layout.cp == 1 for layout in iter_layouts(recipe))


def test_a_recipes_search_table_narrows_the_space_and_names_a_bad_value():
    from attune.recipe import load_recipe, recipe_to_dict
    from attune.space import iter_layouts, lever_domains
    recipe = load_recipe("benchmarks/cpu/llama3_debug_search.toml")
    domains = lever_domains(recipe)
    assert domains["activation_checkpoint.mode"] == ["none", "full"]
    assert domains["parallelism.pipeline_parallel_schedule"] == ["1F1B", "Interleaved1F1B", "ZBVZeroBubble"]
    layouts = list(iter_layouts(recipe))
    assert layouts and all(layout.ac_mode in ("none", "full") and layout.pp_microbatch == 1 for layout in layouts)
    assert "search" not in recipe_to_dict(load_recipe("recipes/cpu/llama3_debug.toml"))  # unchanged identity
    from attune.recipe import recipe_from_dict
    raw = recipe_to_dict(recipe)
    for search, words in (({"compile.enable": []}, "at least one value"),
                          ({"activation_checkpoint.mode": ["most"]}, "'most' is not one of"),
                          ({"optimizer.lr": [1]}, "not a lever")):
        with pytest.raises(InputError) as err:
            recipe_from_dict(raw | {"search": search})
        assert words in str(err.value) and "\n" not in str(err.value)


def test_float8_needs_float8_tensor_cores():
    with pytest.raises(InputError) as err:
        resolve_layout({"quantize.float8": "rowwise"}, LLAMA8, ClusterSpec(accelerator="a100", gpus=8))
    assert err.value.field == "quantize.float8"


def test_adapt_to_a_smaller_cluster_halves_what_no_longer_fits():
    from attune.layout import PP, adapt_to_cluster
    config = {TP: 8, PP: 8, DP_SHARD: 2, LOCAL_BATCH: 1, GLOBAL_BATCH: 16}
    new, changes = adapt_to_cluster(config, catalog_model("llama3.1-405b"), H100_8)
    layout = resolve_layout(new, catalog_model("llama3.1-405b"), H100_8)
    assert layout.world == 8 and layout.global_batch == 16
    assert DP_SHARD in changes and (TP in changes or PP in changes)


# ---- the pipeline micro-batch rule (torch 2.13's schedule constructors) -------------------------

PP_KEYS = {"pp": "parallelism.pipeline_parallel_degree", "schedule": "parallelism.pipeline_parallel_schedule",
           "mb": "parallelism.pipeline_parallel_microbatch_size"}


def _piped(pp, schedule, local, mb=1, gpus=8, **more):
    config = {PP_KEYS["pp"]: pp, PP_KEYS["schedule"]: schedule, PP_KEYS["mb"]: mb, LOCAL_BATCH: local,
              GLOBAL_BATCH: local * gpus // pp, "activation_checkpoint.mode": "full"} | more
    return resolve_layout(config, LLAMA8, ClusterSpec(accelerator="h100", gpus=gpus))


def test_1f1b_needs_at_least_as_many_pipeline_microbatches_as_stages():
    # torch: "Number of microbatches (2) must be greater than or equal to the number of stages (4)"
    with pytest.raises(InputError) as err:
        _piped(4, "1F1B", local=4, mb=2)
    assert err.value.field == PP_KEYS["mb"]
    assert "1F1B needs at least pp=4 pipeline micro-batches" in err.value.rule and "= 2" in err.value.rule
    assert _piped(4, "1F1B", local=4).n_microbatches == 4           # exactly pp runs


def test_interleaved_schedules_need_whole_rounds_and_gpipe_zbv_take_any_count():
    # torch: rounds = max(1, n // pp); n must be a multiple of it (pp 4: 9 -> 2 rounds, refused)
    for schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        with pytest.raises(InputError) as err:
            _piped(4, schedule, local=9)
        assert err.value.field == PP_KEYS["mb"] and "whole rounds" in err.value.rule
        assert _piped(4, schedule, local=10).n_microbatches == 10   # 2 rounds of 5
        assert _piped(4, schedule, local=3).n_microbatches == 3     # fewer than pp: one round
    for schedule in ("GPipe", "ZBVZeroBubble"):
        assert _piped(4, schedule, local=1).n_microbatches == 1


def test_zero_bubble_schedules_refuse_compile_and_selective_recomputation():
    # torch 2.13 splits their backward in two: compiled stages are refused, selective AC backwards twice
    for schedule in ("ZBVZeroBubble", "InterleavedZeroBubble"):
        for more in ({"compile.enable": True}, {"activation_checkpoint.mode": "selective"}):
            with pytest.raises(InputError) as err:
                _piped(2, schedule, local=2, **more)
            assert err.value.field == PP_KEYS["schedule"] and schedule in err.value.rule
        assert _piped(2, schedule, local=2, **{"activation_checkpoint.mode": "none"}).pp == 2
    assert _piped(2, "1F1B", local=2, **{"compile.enable": True, "activation_checkpoint.mode": "selective"}).pp == 2
    # without a pipeline the schedule is inert: nothing to refuse
    assert resolve_layout({PP_KEYS["schedule"]: "ZBVZeroBubble", "compile.enable": True}, LLAMA8, H100_8).pp == 1


def test_without_pipelining_the_schedule_asks_nothing_of_the_batch():
    assert resolve_layout({PP_KEYS["schedule"]: "1F1B", LOCAL_BATCH: 1}, LLAMA8, H100_8).n_microbatches == 1


def _shipped_recipes():
    """Every recipe the project ships: recipes/, the benchmarks' recipes, the leaderboard's entries."""
    import json
    import tomllib
    from pathlib import Path
    from attune.recipe import load_recipe, recipe_from_dict
    root = Path(__file__).resolve().parents[1]
    files = sorted(root.glob("recipes/**/*.toml")) + sorted(root.glob("benchmarks/**/*.toml"))
    out = [(str(p.relative_to(root)), load_recipe(p)) for p in files if "[config]" in p.read_text()]
    for entry in sorted(root.glob("leaderboard/recipes/**/entry.json")):
        out.append((str(entry.relative_to(root)), recipe_from_dict(tomllib.loads(json.loads(entry.read_text())["recipe_toml"]))))
    assert len(out) >= 30
    return out


@pytest.mark.parametrize("name, recipe", _shipped_recipes(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_shipped_recipe_keeps_every_layout_rule(name, recipe):
    """The scalar rules, the vectorised ones and the domain pre-filter all accept the recipe as written."""
    from attune.layout import layout_violations, microbatch_rule
    from attune.sim.arrays import from_layouts
    from attune.sim.space_arrays import valid_mask
    from attune.space import lever_domains
    layout = recipe.layout()
    assert layout_violations(layout, recipe.architecture, recipe.cluster) == []
    assert bool(valid_mask(recipe, from_layouts([layout]))[0])
    if layout.pp > 1:
        rule = microbatch_rule(layout.pp_schedule)
        assert rule is None or rule.ok(layout.n_microbatches, layout.pp)
        if "parallelism.pipeline_parallel_degree" not in recipe.search:
            assert layout.pp in lever_domains(recipe)["parallelism.pipeline_parallel_degree"]


def test_a_recipe_is_a_point_of_its_own_space_even_off_the_catalog_values():
    from attune.recipe import load_recipe
    from attune.sim.arrays import from_layouts
    from attune.sim.space_arrays import space_arrays   # = iter_layouts (tests/test_sim_space.py), fast
    from attune.space import lever_domains
    recipe = load_recipe("recipes/moe/deepseek_v3_671b_pp16.toml")     # local batch 128: not a catalog value
    assert recipe.layout().local_batch == 128 and 128 in lever_domains(recipe)[LOCAL_BATCH]
    space, base = space_arrays(recipe), from_layouts([recipe.layout()])
    columns = ("tp", "pp", "cp", "ep", "dpr", "dps", "lb", "sched", "mb", "ac", "comp", "f8")
    same = np.logical_and.reduce([getattr(space, c) == getattr(base, c)[0] for c in columns])
    assert same.sum() == 1
