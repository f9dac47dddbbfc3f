"""torchtitan 0.3 trained for real on this machine's CPU (attune/stacks/torchtitan/cpu.py): the
launch a cpu cluster renders, a 2-process and a 1-process trial of the llama3 debug model, and
the gate on real torchtitan curves (one legitimate change passes, one fault injected into
torchtitan is caught). About 2 minutes on 2 cores; skipped where torchtitan is not installed."""

from __future__ import annotations

import json
import math

import pytest
from conftest import REPO

from attune.recipe import load_recipe
from attune.spec import parse_cluster_flag
from attune.stacks.base import TrialStatus
from attune.stacks.torchtitan.render import CPU_ATTENTION, CPU_MODULE, render_launch
from attune.stacks.torchtitan.validate import torchtitan_available

RECIPE = REPO / "recipes/cpu/llama3_debug.toml"
needs_torchtitan = pytest.mark.skipif(not torchtitan_available(), reason="torchtitan is not installed")


def test_cpu_launch_loads_the_cpu_module_and_keeps_the_recipe_config():
    launch = render_launch(load_recipe(RECIPE))
    args = launch.train_args
    assert args[:4] == ["--module", CPU_MODULE, "--config", "llama3_debugmodel"]
    assert args[args.index("--override.imports") + 1].split(",")[0] == CPU_ATTENTION
    assert args[args.index("--parallelism.spmd_backend") + 1] == "partial_dtensor"
    assert "--standalone" in launch.argv and "--rdzv-endpoint" not in launch.argv
    assert int(launch.env["OMP_NUM_THREADS"]) >= 1


def test_a_gpu_launch_is_unchanged_by_the_cpu_path():
    recipe = load_recipe(REPO / "recipes/public/llama3_8b.toml")
    launch = render_launch(recipe, rdzv_endpoint="host:1234")
    assert CPU_MODULE not in launch.argv and "--standalone" not in launch.argv
    assert "OMP_NUM_THREADS" not in launch.env


@needs_torchtitan
@pytest.mark.parametrize("processes", [2, 1])
def test_trial_trains_the_debug_model_on_cpu(tmp_path, processes):
    from attune.stacks.torchtitan.stack import TorchtitanStack
    recipe = load_recipe(RECIPE)
    if processes == 1:
        recipe = recipe.on_cluster(parse_cluster_flag("cpu:1", recipe.cluster))
    stack = TorchtitanStack(warmup_steps=1)
    result = stack.run_trial(recipe, steps=3, seed=0, workdir=tmp_path)
    assert result.status == TrialStatus.OK, result.message
    assert [s.step for s in result.steps] == [1, 2, 3, 4]
    losses = [s.loss for s in result.steps]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]  # it learns
    assert math.log(2048) - 1 < losses[0] < math.log(2048) + 1              # from a near-uniform start
    assert result.tokens_per_sec_per_gpu and result.tokens_per_sec_per_gpu > 0
    assert result.peak_memory_gib and 0 < result.peak_memory_gib < 8
    assert result.gpu_hours == pytest.approx(processes * result.wall_time_s / 3600)
    assert "Training starts" in (tmp_path / "train.log").read_text()  # torchtitan's own log, parsed


@needs_torchtitan
def test_gate_on_real_torchtitan_curves(tmp_path, cli):
    proc = cli("gate", "eval", "--stack", "torchtitan", "--only", "T-L01_microbatch_1,T-F01_lr_doubled",
               "--steps", "6", "--workdir", tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["trainer"] == "torchtitan" and report["gpu_hours"] > 0
    cases = {c["id"]: c for c in report["per_case"]}
    assert cases["T-L01_microbatch_1"]["false_reject"] is False
    assert cases["T-F01_lr_doubled"]["caught"] is True
    assert set(cases["T-F01_lr_doubled"]["fired"]) - {"config", "defect"}  # by the curves, not the config
    # the curves the verdict read are real torchtitan records: one per step, per run
    curve = next(tmp_path.rglob("candidate.csv")).read_text().splitlines()
    assert len(curve) == 1 + 6
