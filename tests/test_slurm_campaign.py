"""A whole torchtitan campaign through the Slurm work pool, for real (slow): the fixtures of
tests/slurm_pool.py (two-node Slurm on loopback, `prefect server`, moto's S3 with the result block,
`attune deploy`, the worker of infra/slurm/start-worker.sh) and `mlflow server` on a SQLite file.

`attune tune recipes/cpu/llama3_debug_2node.toml --stack torchtitan` with the gpu-slurm deployment:
every baseline, search and confirmation trial and every gate run is a flow run that the worker runs as
`srun --nodes 2 ... torchrun`; the campaign ships through the gate or keeps the baseline with its
reason, as a local one does; every trial is charged at least Slurm's elapsed time for it, within
the budget, and leaves no allocation behind. About 8 minutes on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from prefect_server import mlflow_server
from slurm_cluster import slurm  # noqa: F401  (a fixture)
from conftest import REPO
from slurm_pool import DEPLOYMENT, RECIPE, deploy, slurm_pool  # noqa: F401  (a fixture)

from attune.stacks.torchtitan.validate import torchtitan_available

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torchtitan_available(), reason="torchtitan is not installed")]
POOL_ENV = {"ATTUNE_TORCHTITAN_DEPLOYMENT": DEPLOYMENT, "ATTUNE_TORCHTITAN_LAUNCHER": "slurm"}


def tune(env: dict[str, str], cwd, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attune.cli.main", "tune", str(RECIPE), "--stack", "torchtitan",
                           *args], env=env | POOL_ENV, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_a_torchtitan_campaign_runs_through_the_slurm_pool_end_to_end(slurm_pool, tmp_path):
    with mlflow_server(tmp_path) as mlflow:
        proc = tune(slurm_pool.env, tmp_path, "--budget-gpu-hours", "0.25", "--replicates", "2", "--steps", "4",
                    "--gate-steps", "8", "--mlflow-uri", mlflow.url, "--json")
        assert proc.returncode == 0, f"{proc.stderr[-4000:]}\nworker:\n{slurm_pool.worker_tail()}"
        result = json.loads(proc.stdout)
        from mlflow.tracking import MlflowClient
        client = MlflowClient(mlflow.url)
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=500)
    assert result["simulated"] is False and result["stack"] == "torchtitan"
    home = slurm_pool.workdir / "attune-home"
    states = [json.loads(f.read_text()) for f in home.glob("campaigns/*/state.json")]
    state = next(s for s in states if s["campaign_id"] == result["campaign_id"])
    trials = state["trials"]
    assert trials and all(t["result"]["status"] == "ok" for t in trials), [t["result"]["message"] for t in trials]
    # every trial ran as a Slurm job on both nodes, charged at least Slurm's elapsed time for it
    jobs = (slurm_pool.slurm.dir / "log" / "jobcomp.log").read_text()
    for t in trials:
        job = t["result"]["breakdown"]["allocation"].split()[-1]
        line = next(ln for ln in jobs.splitlines() if f"JobId={job} " in ln)
        assert "NodeCnt=2" in line
        assert t["result"]["wall_time_s"] >= t["result"]["breakdown"]["allocation_s"]
    # a verdict: the gate read real torchtitan runs through the pool, or the baseline was kept with its reason
    gate = result["gate"]
    if gate is not None:
        assert gate["trainer"] == "torchtitan" and gate["gpu_hours"] > 0 and gate["passed"] in (True, False)
        assert result["shipped"] == gate["passed"]
    else:
        assert result["stop_reason"] and not result["shipped"]
    trial_hours = sum(t["result"]["gpus"] * t["result"]["wall_time_s"] / 3600 for t in trials)
    assert result["gpu_hours_used"] == pytest.approx(trial_hours + result["gate_gpu_hours"] + result["lost_gpu_hours"],
                                                     rel=1e-6)
    assert result["gpu_hours_used"] <= result["budget_gpu_hours"]
    # MLflow (a real server): one run per trial, tagged with its allocation
    tagged = [r for r in runs if r.data.tags.get("attune.allocation", "").startswith("slurm job ")]
    assert len(tagged) == len(trials)
    slurm_pool.slurm.wait_no_jobs()
    flow_runs = slurm_pool.server.api("flow_runs/filter", {})
    trial_runs = [r for r in flow_runs if r["deployment_id"]]
    assert len(trial_runs) >= len(trials) and all(r["state"]["type"] == "COMPLETED" for r in trial_runs)


def test_the_nightly_retune_from_its_deployment_tunes_then_remeasures_on_the_slurm_pool(slurm_pool, tmp_path):
    """The `nightly` deployment on the attune-cpu pool (its own worker), one production recipe on the
    torchtitan stack whose trials go to the gpu-slurm deployment: night 1 has nothing shipped and
    tunes; night 2 re-measures what night 1 shipped, through the pool, and re-tunes only if it
    regressed."""
    from prefect_server import prefect_worker

    registry = tmp_path / "production.toml"
    registry.write_text(f'''[[recipe]]
name = "debug-2node"
path = "{RECIPE}"
stack = "torchtitan"
stack_options = {{deployment = "{DEPLOYMENT}", launcher = "slurm"}}
gpu_pool = "attune-gpu-slurm"
budget_gpu_hours = 0.2
replicates = 2
steps_per_trial = 4
gate_steps = 8
''')
    env = slurm_pool.env | {"ATTUNE_HOME": str(tmp_path / "home"), "ATTUNE_STORE": str(tmp_path / "store"),
                            "MPLBACKEND": "Agg"}
    deploy(env, "--name", "nightly")
    server = slurm_pool.server
    with prefect_worker(server, "attune-cpu", cwd=REPO, env=env):
        nights = {}
        for night in ("2026-12-01", "2026-12-02"):
            found = server.api("deployments/name/nightly-retune/nightly")
            run = server.api(f"deployments/{found['id']}/create_flow_run",
                             {"parameters": {"registry": str(registry), "night": night}})["id"]
            final = server.wait_flow_run(run, 1500, slurm_pool.worker_log)
            assert final["state"]["type"] == "COMPLETED", (final["state"], slurm_pool.worker_tail())
            nights[night] = json.loads((tmp_path / "store" / "nightly" / "debug-2node" / "latest.json").read_text())
    first, second = nights["2026-12-01"], nights["2026-12-02"]
    assert first["campaign"]["stack"] == "torchtitan" and first["action"] != "failed", first
    if first["campaign"].get("shipped"):   # the gate passed night 1's recipe: night 2 re-measures it
        assert second["remeasure"] is not None and second["remeasure"]["regressed"] in (True, False), second
        if not second["remeasure"]["regressed"]:
            assert second["action"] == "none", second    # nothing changed, nothing regressed: no campaign
    # every trial of both nights ran as a Slurm job on the two nodes; nothing left allocated
    jobs = [ln for ln in (slurm_pool.slurm.dir / "log" / "jobcomp.log").read_text().splitlines()
            if str(tmp_path) in ln]
    assert jobs and all("NodeCnt=2" in ln for ln in jobs)
    slurm_pool.slurm.wait_no_jobs()
