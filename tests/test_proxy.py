"""The proxy stack: deterministic, faithful to the recipe's structure, faults change what they should."""

from __future__ import annotations

import pytest

from attune.proxy import ProxyConfig, proxy_config, run
from attune.proxy.corpus import VOCAB_SIZE, documents
from attune.proxy.data import global_batch_docs, step_samples
from attune.proxy.faults import fault_catalog, fault_names
from attune.proxy.step import Trainer
from attune.recipe import load_recipe

SMALL = dict(steps=3, dp=2, local_batch=2, ac_mode="none", seq_len=32)


def _losses(cfg: ProxyConfig, steps: int = 3) -> list[float]:
    trainer = Trainer(cfg)
    return [trainer.step(step_samples(cfg, s), s).loss for s in range(1, steps + 1)]


def test_corpus_is_generated_and_deterministic():
    assert documents("train", 50) == documents("train", 50)
    assert set(documents("eval", 20)).isdisjoint(documents("train", 2000))
    assert VOCAB_SIZE < 40


def test_run_is_bitwise_repeatable_and_records_step1():
    a, b = run(ProxyConfig(**SMALL)), run(ProxyConfig(**SMALL))
    assert [r.loss for r in a.rows] == [r.loss for r in b.rows]
    assert a.rows[0].loss > a.rows[-1].loss or a.rows[0].eval_loss > a.rows[-1].eval_loss
    for key in ("forward_loss", "grad_norm", "group_grad_norms", "grad_sketch", "update_norm", "lr",
                "post_clip_norm", "eval_after_update", "expert_load", "dropped_tokens"):
        assert key in a.step1


def test_replicates_differ_only_by_their_noise_seed():
    a = run(ProxyConfig(**SMALL, noise_seed=1))
    b = run(ProxyConfig(**SMALL, noise_seed=2))
    assert a.step1["forward_loss"] == b.step1["forward_loss"]          # same seed checkpoint, same batch
    assert a.step1["grad_sketch"] != b.step1["grad_sketch"]             # run-to-run jitter after reduction
    assert [r.batch_hash for r in a.rows] == [r.batch_hash for r in b.rows]


@pytest.mark.parametrize("split", [dict(local_batch=1, grad_accum=2), dict(tp=2), dict(cp=2), dict(ep=2),
                                   dict(dp_replicate=2), dict(ac_mode="full"), dict(ac_mode="selective"),
                                   dict(pp=2, pp_microbatches=2)])
def test_speed_levers_keep_the_math(split):
    base = ProxyConfig(**SMALL, nondeterminism=0.0)
    other = base.model_copy(update=split)
    for x, y in zip(_losses(base, 2), _losses(other, 2)):
        assert abs(x - y) < 1e-5


def test_data_order_follows_the_dp_degree():
    base = ProxyConfig(**SMALL)
    assert global_batch_docs(base, 2) == global_batch_docs(base.model_copy(update={"local_batch": 1,
                                                                                    "grad_accum": 2}), 2)
    other_dp = ProxyConfig(**(SMALL | {"dp": 1, "grad_accum": 2}))
    assert global_batch_docs(base, 2) != global_batch_docs(other_dp, 2)
    as_other = base.model_copy(update={"data_dp": 1})
    assert global_batch_docs(as_other, 2) == global_batch_docs(other_dp, 2)


def test_faults_are_cataloged_and_validated():
    assert len(fault_names()) >= 24
    for name, spec in fault_catalog().items():
        assert spec["where"] in {"data", "loss", "grad", "optim", "model"} and spec["analog"], name
    with pytest.raises(ValueError):
        ProxyConfig(faults=("no_such_fault",))


@pytest.mark.slow
@pytest.mark.parametrize("fault", fault_names())
def test_each_fault_changes_the_run(fault):
    cfg = ProxyConfig(**(SMALL | {"local_batch": 2, "grad_accum": 2, "pp": 2, "pp_microbatches": 2, "steps": 3}),
                      nondeterminism=0.0)
    clean, broken = run(cfg), run(cfg.model_copy(update={"faults": (fault,)}))
    assert clean.model_dump(exclude={"seconds", "config"}) != broken.model_dump(exclude={"seconds", "config"})


def test_recipe_maps_onto_the_proxy(write_recipe):
    recipe = load_recipe(write_recipe())  # llama3.1-8b on 8 GPUs, local batch 2, seq 8192, selective AC
    cfg = proxy_config(recipe, steps=10)
    assert (cfg.dp, cfg.local_batch, cfg.grad_accum, cfg.seq_len, cfg.ac_mode, cfg.moe) == \
        (8, 2, 1, 64, "selective", False)
    big = recipe.on_cluster(recipe.cluster.model_copy(update={"gpus": 64}))
    scaled = proxy_config(big)
    assert scaled.global_batch <= 32 and scaled.dp < 64


def test_recompute_replay_check_sees_routing_drift():
    cfg = ProxyConfig(steps=1, dp=4, local_batch=4, ac_mode="selective")  # enough tokens for near-ties
    assert run(cfg).step1["recompute_mismatch"] == 0
    drift = cfg.model_copy(update={"faults": ("ac_recompute_drift",)})
    assert run(drift).step1["recompute_mismatch"] > 0
