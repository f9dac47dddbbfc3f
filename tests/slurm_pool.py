"""Everything a Slurm pool needs, started the way an operator would, for the tests of that path:

    slurm_cluster          scripts/slurm_local.sh: munged, slurmctld, slurmd n1 and n2 (fixture `slurm`)
    prefect server start   its own PREFECT_HOME and SQLite file
    moto's S3 server       a bucket for trial results (no folder is shared between worker and caller)
    attune deploy          the attune-gpu-slurm and attune-gpu-k8s pools, the gpu-slurm and gpu-k8s trial
                           deployments, and --result-storage s3://BUCKET/results (the S3 block)
    start-worker.sh        the Slurm pool's worker, with PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK set

The module-scoped fixture `slurm_pool` yields a SlurmPool; every process is stopped by its pid after
the module (import the fixtures `slurm` and `slurm_pool` into the test module).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import boto3
import pytest
from conftest import REPO
from prefect_server import Server, _wait_worker, free_port, prefect_server, spawn, stop, tail
from s3_server import KEY_ID, SECRET, s3_env, s3_server
from slurm_cluster import SlurmCluster

RECIPE = REPO / "recipes/cpu/llama3_debug_2node.toml"
POOL, DEPLOYMENT = "attune-gpu-slurm", "attune-torchrun-trial/gpu-slurm"
BUCKET, RESULT_BLOCK = "attune-trial-results", "s3-bucket/attune-results"


@dataclass
class SlurmPool:
    slurm: SlurmCluster
    server: Server
    s3_url: str
    env: dict[str, str]            # for a campaign or `attune trial run` on this pool
    worker_env: dict[str, str]
    workdir: Path
    worker: subprocess.Popen | None = None
    bucket: str = BUCKET
    s3_keys: dict[str, str] = field(default_factory=lambda: {"aws_access_key_id": KEY_ID,
                                                             "aws_secret_access_key": SECRET})

    @property
    def worker_log(self) -> Path:
        return self.workdir / "worker.log"

    @property
    def local_results(self) -> Path:
        return Path(self.env["PREFECT_LOCAL_STORAGE_PATH"])

    def worker_tail(self) -> str:
        return tail(self.worker_log)

    def start_worker(self) -> subprocess.Popen:
        self.worker = spawn(["bash", str(REPO / "infra/slurm/start-worker.sh")], self.worker_env, self.worker_log,
                            cwd=REPO)
        _wait_worker(self.server, POOL, self.worker, self.worker_log, 90)
        return self.worker

    def stop_worker(self) -> None:
        if self.worker is not None:
            stop(self.worker)
            self.worker = None


def deploy(env: dict[str, str], *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "attune.cli.main", "deploy", *args, "--json"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@contextlib.contextmanager
def slurm_pool_for(slurm: SlurmCluster, workdir: Path) -> Iterator[SlurmPool]:
    with prefect_server(workdir) as server, s3_server(workdir) as s3_url:
        aws = s3_env(s3_url, workdir)
        boto3.client("s3", endpoint_url=s3_url, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        # srun passes the flow run's environment to both nodes: ATTUNE_RDZV_PORT reaches node_entry.
        # PREFECT_LOCAL_STORAGE_PATH is a folder nobody should write results to: results go to S3.
        env = slurm.env(server.client_env(ATTUNE_HOME=workdir / "attune-home", PYTHONPATH=REPO,
                                          PREFECT_LOCAL_STORAGE_PATH=workdir / "unshared-results",
                                          ATTUNE_RDZV_PORT=free_port()))
        report = deploy(env | aws, "--name", "gpu-slurm", "--name", "gpu-k8s", "--result-storage",
                        f"s3://{BUCKET}/results")
        assert POOL in report["pools"] and report["result_storage"] == RESULT_BLOCK, report
        # the worker reaches S3 through the block alone: no AWS variables in its environment
        worker_env = env | {"PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "5",
                            "PREFECT_WORKER_HEARTBEAT_SECONDS": "5",
                            "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK": RESULT_BLOCK}
        pool = SlurmPool(slurm=slurm, server=server, s3_url=s3_url, env=env, worker_env=worker_env, workdir=workdir)
        pool.start_worker()
        try:
            yield pool
        finally:
            pool.stop_worker()


@pytest.fixture(scope="module")
def slurm_pool(slurm, tmp_path_factory) -> Iterator[SlurmPool]:
    with slurm_pool_for(slurm, tmp_path_factory.mktemp("pool")) as pool:
        yield pool
