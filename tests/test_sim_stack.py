"""SimStack: the Stack protocol on the simulated cluster."""

from __future__ import annotations

import json

import pytest

from attune.errors import InputError
from attune.recipe import recipe_from_dict
from attune.sim.estimator import estimate
from attune.sim.oracle import truth_tps
from attune.stacks.base import TrialStatus
from attune.stacks.sim import SimStack

STEP_KEYS = {"compute_s", "recompute_s", "bubble_s", "optimizer_s", "other_s"}
COMM_KEYS = {"fsdp", "tp", "pp", "ep", "cp", "dp_replicate"}
MEMORY_KEYS = {"params", "grads", "optimizer", "activations", "other"}


def _recipe(model="llama3.1-8b", accel="h100", gpus=8, **config):
    cfg = {"training.seq_len": 4096, "training.local_batch_size": 1, "compile.enable": True} | {
        k.replace("__", "."): v for k, v in config.items()}
    return recipe_from_dict({"name": "t", "model": model, "cluster": {"accelerator": accel, "gpus": gpus},
                             "stack": {"torch": "2.13.0", "torchtitan": "0.3.0"}, "config": cfg})


def test_a_trial_reports_noisy_steps_a_documented_breakdown_and_its_full_cost(tmp_path):
    recipe = _recipe()
    result = SimStack().run_trial(recipe, steps=10, seed=1, workdir=tmp_path / "t")
    assert result.status == TrialStatus.OK and result.stack == "sim" and result.simulated
    assert len(result.steps) == 10 and all(s.loss is None and s.memory_gib for s in result.steps)
    assert result.steps[0].tps < 0.6 * result.steps[1].tps            # warm-up step
    tps = [s.tps for s in result.steps[1:]]
    assert len(set(tps)) > 1 and max(tps) / min(tps) < 1.15            # noise of a few percent
    truth = truth_tps(recipe)
    assert result.tokens_per_sec_per_gpu == pytest.approx(truth, rel=0.08)
    b = result.breakdown
    assert STEP_KEYS <= set(b) and set(b["exposed_comm_s"]) == COMM_KEYS and set(b["memory_gib"]) == MEMORY_KEYS
    assert b["hbm_gib"] == 80
    parts = sum(b[k] for k in STEP_KEYS) + sum(b["exposed_comm_s"].values())
    assert parts == pytest.approx(result.step_time_s, rel=1e-3)
    # start-up (launch + compile) and the slow first step are charged; nothing sleeps
    assert result.wall_time_s > 60 + 45 + 9 * result.step_time_s
    assert result.gpu_hours == pytest.approx(8 * result.wall_time_s / 3600)
    assert json.loads((tmp_path / "t" / "sim_trial.json").read_text())["simulated"] is True


def test_same_seed_same_run_other_seed_other_noise():
    recipe, stack = _recipe(), SimStack()
    a, b, c = (stack.run_trial(recipe, 5, seed, None) for seed in (3, 3, 4))
    assert a.tokens_per_sec_per_gpu == b.tokens_per_sec_per_gpu != c.tokens_per_sec_per_gpu
    assert a.wall_time_s == b.wall_time_s


def test_out_of_memory_is_charged_startup_and_the_first_step():
    recipe = _recipe("llama3.1-70b", "h100", 8, activation_checkpoint__mode="none", training__local_batch_size=4,
                     compile__enable=False)
    result = SimStack().run_trial(recipe, steps=20, seed=0, workdir=None)
    assert result.status == TrialStatus.OOM and not result.steps and result.tokens_per_sec_per_gpu is None
    assert "out of memory" in result.message and result.peak_memory_gib > 80
    assert 50 < result.wall_time_s < 600
    assert set(result.breakdown["memory_gib"]) == MEMORY_KEYS


def test_the_wall_time_estimate_is_conservative():
    for recipe in (_recipe(), _recipe("qwen3-30b-a3b", "h100", 16, training__global_batch_size=64,
                                      parallelism__expert_parallel_degree=8, activation_checkpoint__mode="full")):
        stack = SimStack()
        for seed in range(3):
            result = stack.run_trial(recipe, steps=20, seed=seed, workdir=None)
            assert stack.estimate_wall_time_s(recipe, 20) >= result.wall_time_s


def test_faults_are_rare_seeded_and_off_by_default():
    recipe = _recipe()
    assert all(SimStack().run_trial(recipe, 3, s, None).ok for s in range(20))
    faulty = [SimStack(fault_rate=0.5).run_trial(recipe, 3, s, None) for s in range(40)]
    statuses = {r.status for r in faulty}
    assert TrialStatus.OK in statuses and statuses & {TrialStatus.NCCL_ERROR, TrialStatus.TIMEOUT}
    assert [r.status for r in faulty] == [SimStack(fault_rate=0.5).run_trial(recipe, 3, s, None).status
                                          for s in range(40)]
    with pytest.raises(InputError):
        SimStack(fault_rate=2.0)


def test_a_run_sees_the_ground_truth_not_the_estimate():
    recipe = _recipe("qwen3-30b-a3b", "h100", 16, training__global_batch_size=64,
                     parallelism__expert_parallel_degree=16)
    result = SimStack().run_trial(recipe, steps=30, seed=0, workdir=None)
    assert result.tokens_per_sec_per_gpu == pytest.approx(truth_tps(recipe), rel=0.05)
    assert result.tokens_per_sec_per_gpu != pytest.approx(estimate(recipe).tokens_per_sec_per_gpu, rel=1e-3)


def test_cluster_seed_changes_the_cluster():
    recipe = _recipe()
    a = SimStack(cluster_seed=0).run_trial(recipe, 5, 1, None)
    b = SimStack(cluster_seed=1).run_trial(recipe, 5, 1, None)
    assert a.tokens_per_sec_per_gpu != b.tokens_per_sec_per_gpu
