"""The command each node of a multi-node trial runs: set torchrun's rendezvous endpoint from what
the scheduler knows, then become the given command (os.execvp: signals and exit codes pass through).

torchrun reads any option it is not given from PET_<OPTION>; rendered pool launches leave out
--rdzv-endpoint, so PET_RDZV_ENDPOINT set here decides it.

  --slurm   (under srun) endpoint = the allocation's first host (SLURM_JOB_NODELIST), the command
            after `--` is the torchrun argv.
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

PORT = os.environ.get("ATTUNE_RDZV_PORT", "29500")


def slurm_head() -> str:
    nodelist = os.environ["SLURM_JOB_NODELIST"]
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True)
    return out.stdout.split()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm", action="store_true")
    parser.add_argument("--k8s", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.slurm:
        os.environ["PET_RDZV_ENDPOINT"] = f"{slurm_head()}:{PORT}"
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
