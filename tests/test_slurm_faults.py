"""Faults on the real Slurm pool, one test each (slow): a node lost mid-trial, a trial that hangs,
the worker killed while a trial runs, the Prefect server restarted mid-campaign, and the campaign's
own process killed and the command run again. The fixtures are tests/slurm_pool.py's (two-node
Slurm on loopback, `prefect server`, moto's S3, `attune deploy`, the worker of start-worker.sh).

Every case: the campaign ends with a result (or resumes to one) whose books add up (trials + lost +
gate = spent <= budget), every trial that counts ran once as its own Slurm job, the fault shows as
lost GPU-hours (an attempt retried), and no allocation is left on the cluster. The trials are short
(a small budget), and the hang rules tight (ATTUNE_TORCHTITAN_STALL_TIMEOUT_S) so a hang costs
seconds, not the default ten minutes. About 15 minutes in all on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect_server import stop, tail
from slurm_cluster import slurm  # noqa: F401  (a fixture)
from slurm_pool import DEPLOYMENT, RECIPE, SlurmPool, slurm_pool  # noqa: F401  (a fixture)

from attune.stacks.torchtitan.validate import torchtitan_available

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torchtitan_available(), reason="torchtitan is not installed")]
TIMEOUTS = {"ATTUNE_TORCHTITAN_STARTUP_TIMEOUT_S": "90", "ATTUNE_TORCHTITAN_STALL_TIMEOUT_S": "20"}
ARGS = ["--budget-gpu-hours", "0.08", "--replicates", "2", "--steps", "3", "--gate-steps", "6", "--json", "--quiet"]


class Campaign:
    """`attune tune` on the two-node recipe through the pool, in its own ATTUNE_HOME."""

    def __init__(self, pool: SlurmPool, workdir: Path):
        self.pool, self.workdir = pool, workdir
        self.home = workdir / "home"
        self.env = pool.env | TIMEOUTS | {"ATTUNE_HOME": str(self.home), "ATTUNE_TORCHTITAN_DEPLOYMENT": DEPLOYMENT,
                                          "ATTUNE_TORCHTITAN_LAUNCHER": "slurm"}
        self.log = workdir / "tune.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        out = open(self.workdir / "tune.out", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "attune.cli.main", "tune", str(RECIPE), "--stack",
                                      "torchtitan", *ARGS], env=self.env, cwd=self.workdir, stdout=out,
                                     stderr=open(self.log, "ab"), start_new_session=True)
        return self.proc

    def wait(self, timeout_s: float = 1200) -> dict:
        try:
            rc = self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                stop(self.proc)
        assert rc == 0, f"attune tune exited {rc}:\n{tail(self.log, 30)}\nworker:\n{self.pool.worker_tail()}"
        return json.loads((self.workdir / "tune.out").read_text())

    def trial_logs(self) -> list[Path]:
        return sorted(self.home.glob("campaigns/*/trials/*/train.log"))

    def wait_mid_trial(self, timeout_s: float = 300) -> Path:
        """Until a trial's log shows a training step: the trial is running on both nodes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for log in self.trial_logs():
                if "step:" in log.read_text(errors="replace"):
                    return log
            assert self.proc.poll() is None, f"campaign ended early:\n{tail(self.log, 30)}"
            time.sleep(0.5)
        raise TimeoutError(f"no trial step within {timeout_s:.0f}s:\n{tail(self.log)}\n{self.pool.worker_tail()}")

    def state(self) -> dict:
        return json.loads(next(self.home.glob("campaigns/*/state.json")).read_text())


def gpu_hours(trial: dict) -> float:
    return trial["result"]["gpus"] * trial["result"]["wall_time_s"] / 3600


def check_books(campaign: Campaign, result: dict, *, lost: bool = True) -> dict:
    """The invariants of every fault: the budget adds up and holds, each trial ran once as its own
    Slurm job, the fault cost lost GPU-hours, and nothing is left allocated."""
    state = campaign.state()
    trials = state["trials"]
    assert trials and all(t["result"]["status"] == "ok" for t in trials), [t["result"]["message"] for t in trials]
    spent = sum(gpu_hours(t) for t in trials) + result["gate_gpu_hours"] + result["lost_gpu_hours"]
    assert result["gpu_hours_used"] == pytest.approx(spent, rel=1e-6)
    assert result["gpu_hours_used"] <= result["budget_gpu_hours"] + 1e-9
    jobs = [t["result"]["breakdown"]["allocation"] for t in trials]
    assert len(set(jobs)) == len(jobs), jobs  # no trial recorded twice
    if lost:
        assert result["lost_gpu_hours"] > 0, result
    campaign.pool.slurm.wait_no_jobs(60)
    return state


@pytest.fixture
def campaign(slurm_pool, tmp_path):
    if slurm_pool.worker is None or slurm_pool.worker.poll() is not None:
        slurm_pool.start_worker()   # a test before may have killed it
    yield Campaign(slurm_pool, tmp_path)
    slurm_pool.slurm.wait_no_jobs(60)


def test_a_node_lost_mid_trial_is_retried_once_it_is_back(campaign):
    campaign.start()
    campaign.wait_mid_trial()
    killed = campaign.pool.slurm.lose_node("n2")
    assert killed, "nothing ran on n2"
    time.sleep(3)
    campaign.pool.slurm.restore_node("n2")
    check_books(campaign, campaign.wait())


def test_a_hung_trial_is_ended_by_the_stall_timeout_and_its_allocation_released(campaign):
    campaign.start()
    campaign.wait_mid_trial()
    hung = campaign.pool.slurm.task_processes("n1") + campaign.pool.slurm.task_processes("n2")
    assert hung, "no task of the trial found"
    for pid in hung:  # every task of the job freezes; Slurm's daemons stay up
        os.kill(pid, signal.SIGSTOP)
    try:
        result = campaign.wait()
    finally:
        for pid in hung:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    state = check_books(campaign, result)
    assert "timeout" in json.dumps(state).lower() or result["lost_gpu_hours"] > 0


def test_the_worker_killed_while_a_trial_runs_loses_that_attempt_only(campaign):
    campaign.start()
    campaign.wait_mid_trial()
    campaign.pool.stop_worker()       # the worker and the flow run it started, SIGKILL after SIGTERM
    campaign.pool.start_worker()      # an operator (or systemd) starts it again
    check_books(campaign, campaign.wait())


def test_the_prefect_server_restarted_mid_campaign_is_waited_out(campaign):
    server = campaign.pool.server
    campaign.start()
    campaign.wait_mid_trial()
    server.restart()   # the same server again: its database, port and environment (as systemd would)
    check_books(campaign, campaign.wait(), lost=False)


def test_the_campaign_killed_mid_trial_resumes_when_run_again(campaign):
    campaign.start()
    campaign.wait_mid_trial()
    os.killpg(campaign.proc.pid, signal.SIGKILL)
    campaign.proc.wait()
    pending = campaign.state().get("pending")
    assert pending, "the trial in flight is in the saved state"
    campaign.pool.slurm.wait_no_jobs(120)   # the orphaned trial ends on its own, nothing stays allocated
    campaign.start()
    check_books(campaign, campaign.wait())
