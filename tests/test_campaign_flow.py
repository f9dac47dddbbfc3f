"""The campaign end to end on the sim stack: a real Prefect flow, MLflow on SQLite, the budget,
resume after a kill, the noise band and the search rules."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, assert_one_line_error

from attune.campaign.state import CampaignState

PUBLIC_8B = REPO / "recipes" / "public" / "llama3_8b.toml"
FAST_GATE = ("--gate-steps", "20")   # the gate's own tests cover its full default; here it only has to run


def _state_files(home: Path) -> list[Path]:
    return sorted(home.glob("campaigns/*/state.json"))


def test_campaign_end_to_end_with_prefect_and_mlflow(cli, tmp_path):
    proc = cli("tune", PUBLIC_8B, "--budget-gpu-hours", "40", "--json", "--quiet", *FAST_GATE, check=True, timeout=900)
    result = json.loads(proc.stdout)
    for key in ("baseline", "best", "gain", "noise_band", "gpu_hours_used", "budget_gpu_hours", "trials",
                "stop_reason", "gate", "gate_probes", "shipped", "payback_hours", "mlflow_run_id", "recipe_out"):
        assert key in result, key
    assert result["simulated"] is True
    assert 0 < result["gpu_hours_used"] <= result["budget_gpu_hours"] == 40
    assert result["noise_band"] > 0
    state = CampaignState.load(_state_files(tmp_path / ".attune")[0])
    assert sum(t.result.gpu_hours for t in state.trials) == pytest.approx(result["gpu_hours_used"])
    assert len(state.of_role("baseline")) == 3
    assert result["gate_probes"] == [{"levers": p["levers"], "passed": p["passed"]} for p in state.gate_probes]
    if result["shipped"] and result["best"]["levers"]["quantize.float8"] != state.trials[0].levers["quantize.float8"]:
        # a float8 layout was measured only after the gate had passed it on the proxy (gate-probe)
        assert {"levers": result["best"]["levers"], "passed": True} in result["gate_probes"]
    if result["shipped"]:
        assert result["gain"] > result["noise_band"] / 2 and result["gate"]["passed"]
        assert result["payback_hours"] > 0
        shipped = cli("recipe", "show", result["recipe_out"], "--json", check=True)
        assert json.loads(shipped.stdout)["layout"]["global_batch"] == state.trials[0].config.get("training.global_batch_size")
    # MLflow: one parent run, one nested run per trial and one per gate verdict, tagged
    db = sqlite3.connect(tmp_path / ".attune" / "mlflow.db")
    runs = db.execute("select run_uuid from runs").fetchall()
    roles = dict(db.execute("select value, count(*) from tags where key='attune.role' group by value").fetchall())
    assert len(runs) == result["trials"] + roles.get("gate", 0) + 1
    assert roles.get("baseline") == 3 and roles.get("trial", 0) >= 1
    if result["gate"] is not None:  # once, or twice after a fall back; the sim stack's gate trains the proxy
        assert 1 <= roles.get("gate", 0) <= 2
        trainers = db.execute("select distinct value from tags where key='attune.gate_trainer'").fetchall()
        assert trainers == [("proxy",)]
    parents = db.execute("select count(distinct value) from tags where key='mlflow.parentRunId'").fetchone()[0]
    assert parents == 1
    models = db.execute("select distinct value from tags where key='attune.model'").fetchall()
    assert models == [("llama3.1-8b",)]
    # Prefect: each gate probe (the proxy trained before a float8 trial) is a task run of its own
    prefect_db = sqlite3.connect(tmp_path / ".prefect" / "prefect.db")
    probes = prefect_db.execute("select count(*) from task_run where name like 'gate-probe-%'").fetchone()[0]
    assert probes >= len(result["gate_probes"]) and (probes > 0) == bool(result["gate_probes"])


@pytest.mark.slow   # ~50 s; resuming is in make test through test_campaigns_cli's resume case
def test_rerunning_a_finished_campaign_returns_it_without_spending(cli, tmp_path):
    args = ("tune", PUBLIC_8B, "--budget-gpu-hours", "20", "--json", "--quiet", *FAST_GATE)
    first = json.loads(cli(*args, check=True, timeout=900).stdout)
    again = json.loads(cli(*args, check=True, timeout=900).stdout)
    assert again["gpu_hours_used"] == first["gpu_hours_used"] and again["trials"] == first["trials"]


def _servers_of(prefect_home) -> list[int]:
    """Pids of `prefect server` processes started with this PREFECT_HOME."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            environ = open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"server" in cmdline and f"PREFECT_HOME={prefect_home}".encode() in environ:
            pids.append(int(entry))
    return pids


def test_kill_mid_campaign_then_resume_never_charges_twice(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), ATTUNE_HOME=str(tmp_path / ".attune"),
               PREFECT_HOME=str(tmp_path / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    cmd = [sys.executable, "-m", "attune.cli.main", "tune", str(PUBLIC_8B), "--budget-gpu-hours", "60",
           "--json", "--quiet", "--replicates", "2", *FAST_GATE]
    # its own process group (the private Prefect server it starts has a session of its own)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    seen = 0
    while time.monotonic() < deadline and proc.poll() is None:
        files = _state_files(tmp_path / ".attune")
        if files:
            try:
                seen = len(CampaignState.load(files[0]).trials)
            except Exception:
                seen = 0
            if seen >= 3:
                break
        time.sleep(0.02)
    assert proc.poll() is None, "campaign finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # the private Prefect server it started (a session of its own) ends with it, not orphaned
    deadline = time.monotonic() + 20
    while _servers_of(tmp_path / ".prefect") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _servers_of(tmp_path / ".prefect"), "the killed command's Prefect server is still running"
    before = CampaignState.load(_state_files(tmp_path / ".attune")[0])
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    after = CampaignState.load(_state_files(tmp_path / ".attune")[0])
    assert [t.levers for t in after.trials[: len(before.trials)]] == [t.levers for t in before.trials]
    charged = sum(t.result.gpu_hours for t in after.trials) + after.lost_gpu_hours
    assert after.budget.spent_gpu_hours == pytest.approx(charged)
    assert result["gpu_hours_used"] <= 60


@pytest.mark.parametrize("args, needle", [
    (["--planner", "nope"], "--planner"),
    (["--stack", "nope"], "--stack"),
    (["--budget-gpu-hours", "0"], "--budget-gpu-hours"),
    (["--budget-gpu-hours", "-3"], "--budget-gpu-hours"),
    (["--budget-gpu-hours", "0.01"], "less than one baseline run"),
    (["--disable-rule", "no-such-rule"], "--disable-rule"),
    (["--steps", "0"], "--steps: Input should be greater than or equal to 1, got 0"),
    (["--gate-steps", "1"], "--gate-steps"),
    (["--world", "nope"], "--world: unknown world 'nope'"),
    (["--cluster-seed", "-1"], "--cluster-seed"),
    (["--stack", "torchtitan", "--world", "hard"], "only the sim stack has simulated clusters"),
])
def test_bad_requests_exit_2_and_write_nothing(cli, tmp_path, args, needle):
    base = ["tune", PUBLIC_8B]
    if "--budget-gpu-hours" not in args:
        base += ["--budget-gpu-hours", "10"]
    assert_one_line_error(cli(*base, *args), needle)
    assert not (tmp_path / ".attune" / "campaigns").exists()


def test_a_prefect_home_that_cannot_be_made_exits_2(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = cli("tune", PUBLIC_8B, "--budget-gpu-hours", "10", env_extra={"PREFECT_HOME": str(blocker / "prefect")})
    assert_one_line_error(proc, "PREFECT_HOME", "cannot create")
    assert not (tmp_path / ".attune" / "campaigns").exists()


def test_a_recipe_that_fails_its_own_baseline_exits_2(cli, write_recipe, tmp_path):
    # llama3.1-405b on 8 A100s cannot fit in memory whatever the recomputation
    recipe = write_recipe('''
        name = "too-big"
        model = "llama3.1-405b"
        [cluster]
        accelerator = "a100"
        gpus = 8
        [stack]
        torch = "2.13.0"
        torchtitan = "0.3.0"
        [config]
        "training.local_batch_size" = 1
        "activation_checkpoint.mode" = "full"
        ''')
    assert_one_line_error(cli("tune", recipe, "--budget-gpu-hours", "50"), "fails its own baseline")
    assert not list((tmp_path / ".attune").glob("campaigns/*"))
