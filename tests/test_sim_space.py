"""The vectorised lever space equals attune.space.iter_layouts; the oracle searches it fast."""

from __future__ import annotations

import time

import numpy as np
import pytest

from attune.recipe import recipe_from_dict
from attune.sim.estimator import estimate, estimate_many
from attune.sim.ground_truth import measure_many
from attune.sim.oracle import oracle, truth_tps
from attune.sim.space_arrays import iter_space, space_arrays
from attune.space import iter_layouts


def _recipe(model, accel, gpus, **config):
    cfg = {"training.seq_len": 4096, "training.local_batch_size": 1} | {k.replace("__", "."): v for k, v in config.items()}
    return recipe_from_dict({"name": f"{model}-{accel}{gpus}", "model": model,
                             "cluster": {"accelerator": accel, "gpus": gpus},
                             "stack": {"torch": "2.13.0", "torchtitan": "0.3.0"}, "config": cfg})


def _key(layout):
    return tuple(layout.as_dict().values())


@pytest.mark.parametrize("recipe", [
    _recipe("llama3.1-8b", "a100", 8, training__global_batch_size=16),                         # dense, no float8
    _recipe("deepseek-v3-16b", "a100", 8, training__global_batch_size=16, training__seq_len=2048),  # MoE, EP rules
    _recipe("qwen3-30b-a3b", "h100", 4, training__global_batch_size=8),                        # 4 kv heads, float8
    # pipelines of 2-16 stages with 1-128 micro-batches: every schedule's micro-batch rule in play
    _recipe("llama3.1-8b", "h100", 16, training__global_batch_size=256),
], ids=lambda r: r.name)
def test_vectorised_space_equals_iter_layouts(recipe):
    reference = [_key(x) for x in iter_layouts(recipe)]
    space = space_arrays(recipe)
    got = [_key(space.layout(i)) for i in range(len(space))]
    assert got == reference          # same layouts, same order


def test_chunks_cover_the_space_once():
    recipe = _recipe("llama3.1-8b", "a100", 8, training__global_batch_size=16)
    chunks = list(iter_space(recipe, max_rows=500))
    assert len(chunks) > 1
    assert sum(map(len, chunks)) == len(space_arrays(recipe))


def test_estimate_many_matches_estimate_one_by_one():
    recipe = _recipe("qwen3-30b-a3b", "h100", 16, training__global_batch_size=64)
    space = space_arrays(recipe)
    cols = estimate_many(recipe, space.take(np.arange(0, len(space), max(1, len(space) // 7))))
    for j, i in enumerate(range(0, len(space), max(1, len(space) // 7))):
        one = estimate(recipe, space.layout(i))
        assert one.tokens_per_sec_per_gpu == pytest.approx(float(cols["tps"][j]), rel=1e-6)
        assert one.fits == bool(cols["fits"][j])


def test_evaluations_per_second_on_one_core():
    recipe = _recipe("llama3.1-70b", "h100", 64, training__global_batch_size=128, training__seq_len=8192)
    space = space_arrays(recipe)
    t0 = time.perf_counter()
    measure_many(recipe, space)
    rate = len(space) / (time.perf_counter() - t0)
    print(f"\n{len(space):,} ground-truth evaluations at {rate:,.0f}/s")
    assert rate >= 10_000


def test_oracle_finds_a_layout_at_least_as_good_as_the_baseline():
    recipe = _recipe("llama3.1-8b", "h100", 8, training__global_batch_size=32)
    result = oracle(recipe)
    assert result.simulated and result.best is not None and result.evaluated == len(space_arrays(recipe))
    assert result.best.tokens_per_sec_per_gpu >= truth_tps(recipe) > 0
    levers = result.best.levers
    assert levers["parallelism.data_parallel_shard_degree"] * levers["parallelism.tensor_parallel_degree"] \
        * levers["parallelism.pipeline_parallel_degree"] * levers["parallelism.context_parallel_degree"] \
        * levers["parallelism.data_parallel_replicate_degree"] == 8


def test_oracle_reports_nothing_when_nothing_fits():
    result = oracle(_recipe("llama3.1-405b", "a100", 8, training__global_batch_size=8))
    assert result.best is None and result.fitting == 0 and result.evaluated > 0


@pytest.mark.slow
def test_oracle_over_a_256_gpu_moe_space_takes_under_10_seconds():
    recipe = _recipe("qwen3-235b-a22b", "h100", 256, training__global_batch_size=1024,
                     parallelism__expert_parallel_degree=8, activation_checkpoint__mode="full")
    result = oracle(recipe)
    print(f"\n{result.evaluated:,} layouts in {result.seconds:.1f} s")
    assert result.evaluated > 500_000 and result.seconds < 10.0
