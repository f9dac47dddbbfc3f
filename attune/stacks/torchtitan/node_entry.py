"""The command each node of a multi-node trial runs: set torchrun's rendezvous endpoint from what
the scheduler knows, then become the given command (os.execvp: signals and exit codes pass through).

torchrun reads any option it is not given from PET_<OPTION>; rendered pool launches leave out
--rdzv-endpoint, so PET_RDZV_ENDPOINT set here decides it.

  --slurm   (under srun) endpoint = the allocation's first node (SLURM_JOB_NODELIST) at the address
            Slurm reaches it by (its NodeAddr, which is its name unless slurm.conf says otherwise);
            that node hosts the c10d store (is_host=1 in PET_RDZV_CONF, 0 on the others, so two
            nodes on one host cannot both claim it). The command after `--` is the torchrun argv.
            The first node also writes the job id into the trial's folder (its working directory):
            the flow charges the allocation's time as Slurm reports it (slurm_job.py).
  --k8s     (an Indexed Job pod) endpoint = pod 0 of this Job through the headless Service named
            by ATTUNE_RDZV_SUBDOMAIN; pod 0 runs the command after `--` (Prefect's flow-run
            command), every other pod runs the torchrun argv in ATTUNE_TORCHRUN_ARGV.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PORT = os.environ.get("ATTUNE_RDZV_PORT", "29500")


def slurm_head() -> str:
    nodelist = os.environ["SLURM_JOB_NODELIST"]
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True)
    first = out.stdout.split()[0]
    node = subprocess.run(["scontrol", "show", "node", "--oneliner", first], capture_output=True, text=True)
    for field in node.stdout.split():
        if field.startswith("NodeAddr=") and field != "NodeAddr=":
            return field.split("=", 1)[1]
    return first


def host_conf(conf: str | None, is_host: bool) -> str:
    """PET_RDZV_CONF with is_host set, unless the caller already decided it."""
    entries = [e for e in (conf or "").split(",") if e]
    if not any(e.split("=", 1)[0] == "is_host" for e in entries):
        entries.append(f"is_host={int(is_host)}")
    return ",".join(entries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm", action="store_true")
    parser.add_argument("--k8s", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.slurm:
        os.environ["PET_RDZV_ENDPOINT"] = f"{slurm_head()}:{PORT}"
        first = os.environ.get("SLURM_NODEID", "0") == "0"
        os.environ["PET_RDZV_CONF"] = host_conf(os.environ.get("PET_RDZV_CONF"), first)
        if first:
            from attune.stacks.torchtitan.slurm_job import record_job_id
            record_job_id(Path.cwd(), os.environ.get("SLURM_JOB_ID"))
    elif args.k8s:
        job, subdomain = os.environ["JOB_NAME"], os.environ.get("ATTUNE_RDZV_SUBDOMAIN", "attune-torchrun")
        os.environ["PET_RDZV_ENDPOINT"] = f"{job}-0.{subdomain}:{PORT}"
        if os.environ.get("JOB_COMPLETION_INDEX", "0") != "0":
            command = json.loads(os.environ["ATTUNE_TORCHRUN_ARGV"])
            os.environ.update(json.loads(os.environ.get("ATTUNE_TRIAL_ENV", "{}")))
    if not command:
        parser.error("no command to run")
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
