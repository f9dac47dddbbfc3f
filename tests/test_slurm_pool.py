"""Trials through the Slurm work pool, for real: the two-node Slurm cluster of scripts/slurm_local.sh,
`prefect server start`, moto's S3 server with the result-storage block `attune deploy
--result-storage` creates, the attune-gpu-slurm process pool and trial deployments from
`attune deploy`, and the worker started by infra/slurm/start-worker.sh.

`attune trial run recipes/cpu/llama3_debug_2node.toml` with ATTUNE_TORCHTITAN_DEPLOYMENT /
ATTUNE_TORCHTITAN_LAUNCHER=slurm: the worker runs the trial's flow, which runs `srun --nodes 2
--ntasks-per-node 1 ... node_entry --slurm -- torchrun ...`, one torchrun per node with c10d
rendezvous on n1; the outcome comes back to the caller through the S3 bucket (no folder is shared
for results), charged for the allocation's time as Slurm reports it. Bad input on this path is one
line and exit 2 before anything runs. About two minutes; skipped where Slurm or torchtitan is not
installed. The whole campaign and the faults: tests/test_slurm_campaign.py (slow).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import boto3
import pytest
from conftest import assert_one_line_error
from slurm_pool import DEPLOYMENT, RECIPE, slurm_pool  # noqa: F401  (a fixture)
from slurm_cluster import slurm  # noqa: F401  (a fixture)

from attune.stacks.torchtitan.validate import torchtitan_available

pytestmark = pytest.mark.skipif(not torchtitan_available(), reason="torchtitan is not installed")


def trial(env: dict[str, str], cwd, *args: str, deployment: str = DEPLOYMENT, recipe=RECIPE,
          timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attune.cli.main", "trial", "run", str(recipe), *args],
                          env=env | {"ATTUNE_TORCHTITAN_DEPLOYMENT": deployment, "ATTUNE_TORCHTITAN_LAUNCHER": "slurm"},
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_a_two_node_trial_runs_through_the_slurm_pool(slurm_pool, tmp_path):
    started = time.monotonic()
    proc = trial(slurm_pool.env, tmp_path, "--steps", "2", "--warmup", "1", "--workdir", str(tmp_path / "trial"),
                 "--json")
    print(f"pooled two-node trial: {time.monotonic() - started:.1f}s wall")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-3000:]}\nworker:\n{slurm_pool.worker_tail()}"
    result = json.loads(proc.stdout)
    assert result["status"] == "ok" and result["tokens_per_sec_per_gpu"] > 0, result
    # charged for what held the nodes: Slurm's elapsed time where longer than the flow's own
    job = result["breakdown"]["allocation"]
    assert job.startswith("slurm job ") and result["breakdown"]["allocation_s"] >= 1
    assert result["wall_time_s"] >= result["breakdown"]["allocation_s"]
    assert result["gpus"] == 2 and result["gpu_hours"] == pytest.approx(2 * result["wall_time_s"] / 3600)
    # the flow run that ran it completed on the Slurm pool's worker; its result went through S3
    runs = [r for r in slurm_pool.server.api("flow_runs/filter", {}) if r["name"] and r["state"]]
    assert "COMPLETED" in [r["state"]["type"] for r in runs]
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=slurm_pool.s3_url, **slurm_pool.s3_keys)
            .list_objects_v2(Bucket=slurm_pool.bucket).get("Contents", [])]
    assert keys and all(k.startswith("results/") for k in keys), keys
    assert not slurm_pool.local_results.exists() or not any(slurm_pool.local_results.iterdir())
    # Slurm ran it on both nodes, one torchrun each; nothing left allocated
    jobs = (slurm_pool.slurm.dir / "log" / "jobcomp.log").read_text().splitlines()
    trial_jobs = [j for j in jobs if f"JobId={job.split()[-1]} " in j]
    assert len(trial_jobs) == 1 and "NodeList=n[1-2]" in trial_jobs[0] and "NodeCnt=2" in trial_jobs[0]
    assert f"WorkDir={tmp_path / 'trial'}" in trial_jobs[0]
    # the pool's job template reached srun: partition and time limit (02:00:00 = 120 minutes)
    assert "Partition=gpu" in trial_jobs[0] and "TimeLimit=120" in trial_jobs[0]
    log = (tmp_path / "trial" / "train.log").read_text()
    assert len(set(re.findall(r"step:\s+1\s.*loss:\s+([0-9.]+)", log))) == 1  # both ranks, one model
    slurm_pool.slurm.wait_no_jobs()


def test_a_deployment_that_does_not_exist_is_one_line_before_any_run(slurm_pool, tmp_path):
    before = len(slurm_pool.server.api("flow_runs/filter", {}))
    proc = trial(slurm_pool.env, tmp_path, "--steps", "2", deployment="attune-torchrun-trial/gpu-slrum", timeout=120)
    assert_one_line_error(proc, "ATTUNE_TORCHTITAN_DEPLOYMENT", "gpu-slrum", "attune-torchrun-trial/gpu-slurm")
    assert len(slurm_pool.server.api("flow_runs/filter", {})) == before


def test_a_pool_without_a_worker_is_one_line_before_any_run(slurm_pool, tmp_path):
    proc = trial(slurm_pool.env, tmp_path, "--steps", "2", deployment="attune-torchrun-trial/gpu-k8s", timeout=120)
    assert_one_line_error(proc, "attune-gpu-k8s", "no worker online")


def test_more_nodes_than_the_partition_has_is_one_line_before_any_run(slurm_pool, tmp_path):
    four = tmp_path / "four_nodes.toml"
    four.write_text(RECIPE.read_text().replace("gpus = 2\n", "gpus = 4\n"))
    proc = trial(slurm_pool.env, tmp_path, "--steps", "2", recipe=four, timeout=120)
    assert_one_line_error(proc, "needs 4 nodes", "partition gpu has 2")


def test_no_prefect_server_is_one_line(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("PREFECT_")}
    proc = trial(env | {"PREFECT_HOME": str(tmp_path / "ph")}, tmp_path, "--steps", "2", timeout=120)
    assert_one_line_error(proc, "PREFECT_API_URL")
