"""torchtitan 0.3 trained for real on this machine's CPU (attune/stacks/torchtitan/cpu.py): the
launch a cpu cluster renders, a 2-process and a 1-process trial of the llama3 debug model, and
the gate on real torchtitan curves (one legitimate change passes, one fault injected into
torchtitan is caught). About 2 minutes on 2 cores; skipped where torchtitan is not installed."""

from __future__ import annotations

import json
import math
import sqlite3

import pytest
from conftest import REPO

from attune.campaign.state import CampaignState
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
    assert result.status == TrialStatus.OK, result.message   # ok: the layout read back is the one asked for
    assert [s.step for s in result.steps] == [1, 2, 3, 4]
    assert (tmp_path / "outputs" / "config.json").is_file()         # torchtitan's resolved config, read back
    assert any((tmp_path / "torchelastic").iterdir())                # torchrun's logs: here, not /tmp/torchelastic_*
    losses = [s.loss for s in result.steps]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]  # it learns
    assert math.log(2048) - 1 < losses[0] < math.log(2048) + 1              # from a near-uniform start
    assert result.tokens_per_sec_per_gpu and result.tokens_per_sec_per_gpu > 0
    assert result.peak_memory_gib and 0 < result.peak_memory_gib < 8
    assert result.gpu_hours == pytest.approx(processes * result.wall_time_s / 3600)
    assert "Training starts" in (tmp_path / "train.log").read_text()  # torchtitan's own log, parsed


@needs_torchtitan
@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_pipeline_parallel_trains_on_cpu_and_reports_the_last_stage_loss(tmp_path, schedule):
    # torchtitan 0.3 hands torch 2.13's schedule pre-split microbatches (cpu.py routes them); the
    # loss lives on the last stage: rank 1 for 1F1B, rank 0 for the V-shaped ZBVZeroBubble.
    from attune.stacks.torchtitan.stack import TorchtitanStack
    recipe = load_recipe(RECIPE)
    recipe = recipe.with_config(dict(recipe.config) | {
        "parallelism.pipeline_parallel_degree": 2, "parallelism.pipeline_parallel_schedule": schedule,
        "parallelism.pipeline_parallel_microbatch_size": 1})
    result = TorchtitanStack(warmup_steps=1).run_trial(recipe, steps=2, seed=0, workdir=tmp_path)
    assert result.status == TrialStatus.OK, result.message
    losses = [s.loss for s in result.steps]
    assert all(math.log(2048) - 1 < x < math.log(2048) + 1 for x in losses), losses   # no -1 placeholders


@needs_torchtitan
def test_a_process_above_the_cpu_clusters_memory_is_an_out_of_memory_trial(tmp_path):
    from attune.stacks.torchtitan.stack import TorchtitanStack
    recipe = load_recipe(RECIPE)
    recipe = recipe.on_cluster(recipe.cluster.model_copy(update={"hbm_gib": 0.3}))   # torch alone holds more
    result = TorchtitanStack(warmup_steps=1).run_trial(recipe, steps=2, seed=0, workdir=tmp_path)
    assert result.status == TrialStatus.OOM, result.message
    assert "above the 0.30 GiB one process may hold" in result.message


@needs_torchtitan
def test_gate_on_real_torchtitan_curves(tmp_path, cli):
    proc = cli("gate", "eval", "--stack", "torchtitan", "--only", "T-L01_microbatch_1,T-F01_lr_doubled",
               "--steps", "6", "--workdir", tmp_path, "--json", timeout=1200)
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
    # every run started from the one seed checkpoint the eval made (one process, charged like the others)
    (seed,) = tmp_path.glob("seeds/*/outputs/checkpoint/step-0")
    launches = [json.loads(p.read_text())["argv"] for p in tmp_path.glob("runs/*/launch.json")]
    assert len(launches) == 4 and all(a[a.index("--checkpoint.initial_load_path") + 1] == str(seed) for a in launches)


def test_the_gate_reserve_pays_for_real_runs_only_on_torchtitan(tmp_path):
    from attune.campaign.context import CampaignSettings
    from attune.campaign.engine import confirm_reserve, open_campaign
    from attune.campaign.gate_runs import gate_reserve, gate_trainer
    from attune.gate.torchtitan_runs import plan_runs
    sim = open_campaign(load_recipe(REPO / "recipes/public/llama3_8b.toml"),
                        CampaignSettings(budget_gpu_hours=40), home=tmp_path)
    sim_levers = sim.recipe.layout().levers()
    assert gate_trainer(sim) == "proxy" and gate_reserve(sim, sim_levers) == 0.0
    recipe = load_recipe(RECIPE)
    real = open_campaign(recipe, CampaignSettings(budget_gpu_hours=0.2, stack="torchtitan", replicates=2,
                                                  steps_per_trial=5, gate_steps=10, protocol="fixed"), home=tmp_path)
    levers = recipe.layout().levers() | {"training.local_batch_size": 4}
    runs = plan_runs(recipe, real.trial_recipe(levers), 10, seed=0)
    one_run = recipe.cluster.gpus * real.stack.estimate_wall_time_s(recipe, 10) / 3600
    seed = runs.pop("seed")   # the seed checkpoint: one process, no steps, reserved like the others
    assert seed.makes_seed and seed.recipe.cluster.gpus == 1
    seed_run = real.stack.estimate_wall_time_s(seed.recipe, 0) / 3600
    assert gate_trainer(real) == "torchtitan"
    assert gate_reserve(real, levers) == pytest.approx(len(runs) * one_run + seed_run, rel=0.2)
    # a search trial must leave its confirmation replicate and its gate
    assert confirm_reserve(real, levers) == pytest.approx(real.estimated_cost(levers) + gate_reserve(real, levers))
    # fitted to this budget (the gate's runs counted from the start), the first search trial keeps no
    # confirmation in reserve: only the gate and a margin on its own estimate
    fitted = open_campaign(recipe, CampaignSettings(budget_gpu_hours=0.2, stack="torchtitan", replicates=2,
                                                    steps_per_trial=5, gate_steps=10), home=tmp_path)
    assert fitted.state.protocol.fitted
    assert confirm_reserve(fitted, levers) == pytest.approx(0.5 * fitted.estimated_cost(levers) + gate_reserve(fitted, levers))


@needs_torchtitan
@pytest.mark.slow
def test_a_torchtitan_campaign_on_cpu_end_to_end(tmp_path, cli):
    """`attune tune --stack torchtitan` on the debug model: real trials, a gate verdict from real
    torchtitan curves, everything charged to the budget (about 6 minutes on 2 cores)."""
    proc = cli("tune", RECIPE, "--stack", "torchtitan", "--budget-gpu-hours", "0.15", "--replicates", "2",
               "--steps", "5", "--gate-steps", "10", "--json", "--quiet", timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["simulated"] is False and result["stack"] == "torchtitan"
    state = CampaignState.load(next((tmp_path / ".attune").glob("campaigns/*/state.json")))
    trial_hours = sum(t.result.gpu_hours for t in state.trials)
    assert all(t.result.status == TrialStatus.OK for t in state.trials) and trial_hours > 0
    logs = list((tmp_path / ".attune").glob("campaigns/*/trials/*/train.log"))
    assert len(logs) == len(state.trials) and all("Training starts" in p.read_text() for p in logs)
    gate = result["gate"]
    if state.incumbent_record.role != "baseline":  # a move was kept: its gate read torchtitan's curves
        assert gate["trainer"] == "torchtitan" and gate["gpu_hours"] > 0
        assert result["gate_gpu_hours"] == pytest.approx(gate["gpu_hours"])
        assert result["shipped"] == gate["passed"]
    assert result["gpu_hours_used"] == pytest.approx(trial_hours + result["gate_gpu_hours"])
    assert result["gpu_hours_used"] <= result["budget_gpu_hours"]
    db = sqlite3.connect(tmp_path / ".attune" / "mlflow.db")
    roles = dict(db.execute("select value, count(*) from tags where key='attune.role' group by value").fetchall())
    assert roles.get("gate", 0) == (gate is not None)
