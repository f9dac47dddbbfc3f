"""The two-node Slurm cluster on loopback (scripts/slurm_local.sh) behaves as a real cluster does for
what ATTUNE's Slurm pool path relies on: srun puts one task on each node, the allocation's nodelist
and `scontrol show hostnames` read as on a cluster, node_entry --slurm picks the first node as the
rendezvous point, scancel releases an allocation, and stopping leaves no daemon. A few seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from conftest import REPO
from slurm_cluster import SCRIPT, pid_running, slurm, slurm_cluster  # noqa: F401  (slurm: a fixture)

SRUN2 = ["srun", "--nodes", "2", "--ntasks-per-node", "1"]


def test_srun_runs_one_task_on_each_node(slurm):
    started = time.monotonic()
    proc = slurm.run(SRUN2 + ["bash", "-c", 'echo "$SLURMD_NODENAME $SLURM_PROCID $SLURM_JOB_NODELIST '
                                            '$SLURM_JOB_NUM_NODES $(scontrol show hostnames $SLURM_JOB_NODELIST | '
                                            'paste -sd,)"'])
    elapsed = time.monotonic() - started
    rows = sorted(line.split() for line in proc.stdout.splitlines())
    assert rows == [["n1", "0", "n[1-2]", "2", "n1,n2"], ["n2", "1", "n[1-2]", "2", "n1,n2"]], proc.stdout
    assert elapsed < 10, f"a two-node srun took {elapsed:.1f}s"
    nodes = slurm.run(["sinfo", "-h", "-N", "-o", "%N %P %t %c"]).stdout.split("\n")
    assert [n.split() for n in nodes if n] == [["n1", "gpu*", "idle", "1"], ["n2", "gpu*", "idle", "1"]]


def test_scontrol_expands_the_nodelist_as_on_a_cluster(slurm):
    assert slurm.run(["scontrol", "show", "hostnames", "n[1-2]"]).stdout.split() == ["n1", "n2"]


def test_node_entry_takes_the_rendezvous_endpoint_from_the_first_node(slurm, tmp_path):
    """Every node gets the first node's address (its NodeAddr: the names n1, n2 resolve nowhere
    here, as a cluster's node names may not outside it); only the first hosts the c10d store."""
    show = ("import os; print(os.environ['SLURMD_NODENAME'], os.environ['PET_RDZV_ENDPOINT'], "
            "os.environ['PET_RDZV_CONF'])")
    env = slurm.env(PYTHONPATH=str(REPO), ATTUNE_RDZV_PORT="29611")
    proc = slurm.run(SRUN2 + [sys.executable, "-m", "attune.stacks.torchtitan.node_entry", "--slurm", "--",
                              sys.executable, "-c", show], env=env, cwd=tmp_path)   # node_entry writes its job id here
    assert sorted(proc.stdout.splitlines()) == ["n1 127.0.0.1:29611 is_host=1",
                                                "n2 127.0.0.1:29611 is_host=0"], proc.stdout + proc.stderr
    assert (tmp_path / "slurm_job_id").read_text().strip().isdigit()


def test_scancel_releases_the_allocation_and_ends_its_tasks(slurm):
    marker = f"attune-slurm-test-{uuid.uuid4().hex[:8]}"
    job_name = marker
    srun = subprocess.Popen(SRUN2 + ["--job-name", job_name, sys.executable, "-c", "import time; time.sleep(300)",
                                     marker], env=slurm.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        job = _wait_running(slurm, job_name)
        assert len(_tasks(marker)) == 2  # one python per node, both running
        slurm.run(["scancel", job])
        out, _ = srun.communicate(timeout=30)
        assert srun.returncode != 0, out
        slurm.wait_no_jobs()
        deadline = time.monotonic() + 10
        while _tasks(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _tasks(marker), "scancel left the job's tasks running"
        states = slurm.run(["sinfo", "-h", "-N", "-o", "%t"]).stdout.split()
        assert states == ["idle", "idle"]  # both nodes free again
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()


def test_start_is_idempotent_and_stop_leaves_no_daemon(tmp_path):
    with slurm_cluster(tmp_path) as cluster:
        pids = cluster.pids()
        assert set(pids) == {"munged", "slurmctld", "slurmd-n1", "slurmd-n2"}
        again = subprocess.run(["bash", str(SCRIPT), "start", str(tmp_path)], capture_output=True, text=True,
                               timeout=60)
        assert again.returncode == 0 and "already running" in again.stderr and cluster.pids() == pids
        assert f"SLURM_CONF={cluster.conf}" in again.stdout
        status = subprocess.run(["bash", str(SCRIPT), "status", str(tmp_path)], capture_output=True, text=True)
        assert status.returncode == 0 and status.stdout.count(": running (pid") == 4
        print(f"cluster start: {cluster.start_s:.2f}s")
    assert not [name for name, pid in pids.items() if pid_running(pid)]
    status = subprocess.run(["bash", str(SCRIPT), "status", str(tmp_path)], capture_output=True, text=True)
    assert status.returncode == 1 and status.stdout.count(": stopped") == 4


def test_usage_error_is_one_line():
    proc = subprocess.run(["bash", str(SCRIPT), "restart"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("usage:")


def _wait_running(slurm, job_name: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = slurm.run(["squeue", "-h", "-n", job_name, "-o", "%A %T"]).stdout.split()
        if rows[1:2] == ["RUNNING"] and len(_tasks(job_name)) == 2:
            return rows[0]
        time.sleep(0.2)
    raise TimeoutError(f"job {job_name} not running with 2 tasks after {timeout_s:.0f}s:\n{slurm.log_tail()}")


def _tasks(marker: str) -> list[int]:
    """Pids of running processes whose command line holds `marker` (the job's tasks, not srun)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(cmdline.parent.name)
        if marker.encode() in argv and b"srun" not in argv[0] and pid != os.getpid() and pid_running(pid):
            found.append(pid)
    return found
