"""What Slurm itself says about a trial's allocation: its job id, how long it held the nodes, how many
nodes a partition has, and ending it.

A pooled trial is charged for the allocation's real time: the first node writes the job id into the
trial's folder (node_entry --slurm), and the flow on the login node asks Slurm for the job's elapsed
time once srun has returned, from accounting (`sacct`) where the cluster keeps it, else from the
controller's memory of the job (`scontrol show job`, kept MinJobAge seconds, 300 by default).
Every call here is best effort: None when Slurm cannot say, and the caller charges what it measured.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

JOB_ID_FILE = "slurm_job_id"
_TIMEOUT_S = 20


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def record_job_id(folder: Path, job_id: str | None) -> None:
    if job_id:
        (Path(folder) / JOB_ID_FILE).write_text(job_id + "\n")


def recorded_job_id(folder: Path) -> str | None:
    path = Path(folder) / JOB_ID_FILE
    text = path.read_text().strip() if path.is_file() else ""
    return text if text.isdigit() else None


def duration_s(text: str) -> float | None:
    """Slurm's [D-]HH:MM:SS (or MM:SS) as seconds."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def elapsed_s(job_id: str) -> float | None:
    """Seconds the job held its nodes (start to end, or to now while it runs)."""
    first = (_run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "ElapsedRaw"]) or "").strip().split("\n")[0]
    if first.isdigit():
        return float(first)
    out = _run(["scontrol", "show", "job", "--oneliner", job_id])
    match = re.search(r"\bRunTime=(\S+)", out or "")
    return duration_s(match.group(1)) if match else None


def still_listed(job_id: str) -> bool:
    out = _run(["squeue", "-h", "-j", job_id, "-o", "%A"])
    return bool(out and out.split())


def cancel(job_id: str) -> None:
    """Release the allocation (a trial stopped for a stall or a stop must not hold the nodes)."""
    _run(["scancel", "--full", job_id])


def partition_nodes(partition: str | None) -> int | None:
    """Nodes in the partition (the default one for None), or None where `sinfo` cannot say."""
    out = _run(["sinfo", "-h", *(["-p", partition] if partition else []), "-o", "%D %P"])
    if not out:
        return None
    counts = [int(line.split()[0]) for line in out.splitlines()
              if line.split() and line.split()[0].isdigit() and (partition or line.split()[1].endswith("*"))]
    return sum(counts) if counts else None
