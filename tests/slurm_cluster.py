"""A real two-node Slurm cluster on loopback for tests: scripts/slurm_local.sh in a temporary folder.

    with slurm_cluster(tmp_path) as cluster:       # munged, slurmctld, slurmd -N n1, slurmd -N n2
        cluster.run(["srun", "--nodes", "2", "hostname"])
        env = cluster.env(PREFECT_API_URL=...)      # SLURM_CONF for any process that uses the cluster

or the module-scoped fixture `slurm` (import it into the test module: `from slurm_cluster import slurm`).
It skips, saying why, only when Slurm or munge is not installed (`apt-get install slurm-wlm munge`;
.ci/run installs them). Teardown stops every daemon with the script, then SIGKILLs by pid any that
is still there, so a test never leaves a daemon behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "slurm_local.sh"
BINARIES = ("slurmctld", "slurmd", "srun", "scontrol", "munged", "mungekey")
NODES = ("n1", "n2")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if not (shutil.which(b) or Path("/usr/sbin", b).is_file())]


@dataclass
class SlurmCluster:
    dir: Path
    nodes: tuple[str, ...] = NODES

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    def env(self, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
        """Environment for a process that submits to this cluster (srun, scontrol, a worker)."""
        env = dict(os.environ if base is None else base)
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}  # no allocation of a caller's
        return env | {"SLURM_CONF": str(self.conf)} | {k: str(v) for k, v in extra.items()}

    def run(self, argv: list[str], timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, env=kw.pop("env", None) or self.env(), capture_output=True, text=True,
                              timeout=timeout, **kw)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}\n"
                                 f"{self.log_tail()}")
        return proc

    def pids(self) -> dict[str, int]:
        """The daemons' pids, from their pid files (munged, slurmctld, slurmd-n1, slurmd-n2)."""
        out = {}
        for path in sorted((self.dir / "run").glob("*.pid")):
            with contextlib.suppress(ValueError, OSError):
                out[path.stem] = int(path.read_text().strip())
        return out

    def jobs(self) -> list[str]:
        """Ids of the jobs squeue still lists (pending, running or completing)."""
        return self.run(["squeue", "-h", "-o", "%A"]).stdout.split()

    def wait_no_jobs(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while self.jobs():
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still listed after {timeout_s:.0f}s: {self.run(['squeue']).stdout}")
            time.sleep(0.2)

    def step_daemons(self, node: str) -> list[int]:
        """Pids of the slurmstepds of this cluster that serve `node`."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if ((proc / "comm").read_text().strip() == "slurmstepd"
                        and f"SLURM_CONF={self.conf}".encode() in (proc / "environ").read_bytes().split(b"\0")
                        and _stepd_node(int(proc.name)) == node):
                    found.append(int(proc.name))
        return found

    def task_processes(self, node: str) -> list[int]:
        """Pids of the job tasks running on `node` (what its step daemons started)."""
        return [pid for stepd in self.step_daemons(node) for pid in _descendants(stepd)]

    def node_processes(self, node: str) -> list[int]:
        """Pids of what runs on `node`: its slurmd, its slurmstepds and every task they started."""
        slurmd = self.pids().get(f"slurmd-{node}")
        daemons = [slurmd] if slurmd is not None and pid_running(slurmd) else []
        return daemons + self.step_daemons(node) + self.task_processes(node)

    def lose_node(self, node: str) -> list[int]:
        """The node dies: its slurmd, step daemons and tasks are killed at once (SIGKILL)."""
        pids = self.node_processes(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def restore_node(self, node: str, timeout_s: float = 60) -> None:
        """The node comes back: its slurmd starts again and the controller takes it back in service."""
        slurmd = shutil.which("slurmd") or "/usr/sbin/slurmd"
        subprocess.run([slurmd, "-N", node, "-f", str(self.conf)], env=self.env(), check=True, timeout=30,
                       capture_output=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.run(["sinfo", "-h", "-n", node, "-o", "%t"], check=False).stdout.strip()
            if state == "idle":
                return
            if state.startswith(("down", "drain")):
                self.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
            time.sleep(0.5)
        raise TimeoutError(f"{node} did not come back idle: {self.run(['sinfo', '-N'], check=False).stdout}")

    def log_tail(self, lines: int = 15) -> str:
        parts = []
        for log in sorted((self.dir / "log").glob("slurm*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(parts)


def pid_running(pid: int) -> bool:
    """The pid exists and is not a zombie (a daemon killed but not yet reaped by init)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(pid: int) -> list[int]:
    children = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(c) for c in (task / "children").read_text().split()]
    return [d for c in children for d in (c, *_descendants(c))]


def _stepd_node(pid: int) -> str | None:
    """The node a slurmstepd serves, from its tasks' SLURMD_NODENAME (the daemon's own command line
    and environment do not say)."""
    for child in _descendants(pid):
        with contextlib.suppress(OSError):
            for entry in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
                if entry.startswith(b"SLURMD_NODENAME="):
                    return entry.split(b"=", 1)[1].decode()
    return None


def _script(command: str, workdir: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(["bash", str(SCRIPT), command, str(workdir)], env=env, capture_output=True, text=True,
                          timeout=timeout)


@contextlib.contextmanager
def slurm_cluster(workdir: Path) -> Iterator[SlurmCluster]:
    """Start the two-node cluster in `workdir` (the script), yield it, stop it and check by pid."""
    workdir = Path(workdir)
    cluster = SlurmCluster(dir=workdir)
    started = time.monotonic()
    proc = _script("start", workdir)
    pids = cluster.pids()
    try:
        if proc.returncode != 0:
            raise RuntimeError(f"slurm_local.sh start exited {proc.returncode}:\n{proc.stderr}\n{cluster.log_tail()}")
        cluster.start_s = time.monotonic() - started  # type: ignore[attr-defined]
        yield cluster
    finally:
        pids |= cluster.pids()
        _script("stop", workdir)
        for pid in pids.values():  # the script's stop failed for one: by pid, no grace
            if pid_running(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}): apt-get install slurm-wlm munge")
    # (pytest's temporary paths are short enough for munged's socket: a sockaddr_un holds 108 bytes)
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
