"""Trials as Prefect deployment runs on a GPU work pool (kept thin: one flow, one executor).

`torchrun_trial` is the flow a GPU work pool's worker runs; it is runner.run_process on that
machine. `pool_executor(deployment, launcher)` is what TorchtitanStack calls instead of a local
subprocess: it starts a run of the deployment, waits for it, and returns its RunOutcome.

launcher says how one flow run becomes N nodes of torchrun:
  k8s     the work pool's job template (infra/k8s/torchrun-job-template.json) makes an Indexed Job
          of `nnodes` pods; pod 0 runs this flow, the others run the same torchrun argv
          (node_entry.py); every pod gets PET_RDZV_ENDPOINT = pod 0 through a headless Service.
  slurm   a process worker on a Slurm login node runs this flow, which wraps the argv in
          `srun --nodes N --ntasks-per-node 1 ... python -m attune.stacks.torchtitan.node_entry
          --slurm`, so each allocated node runs torchrun with the first node as rendezvous.
  direct  the flow runs the argv as it is (one node, or a rendezvous endpoint already in it).
The flow's result must reach the caller: give the server shared result storage (e.g. an S3 block
as PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK) when worker and campaign do not share a disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attune.stacks.base import TrialStatus
from attune.stacks.torchtitan.render import CPU_MODULE, Launch
from attune.stacks.torchtitan.runner import RunLimits, RunOutcome, run_process

LAUNCHERS = ("k8s", "slurm", "direct")


def srun_argv(launch: Launch) -> list[str]:
    """The torchrun argv run on every node of the Slurm allocation by srun (one task per node).
    A CPU launch (torchtitan's CPU module: a process is a "GPU") asks for no GPUs."""
    gpus = [] if CPU_MODULE in launch.argv else [f"--gpus-per-node={launch.nproc_per_node}"]
    return ["srun", f"--nodes={launch.nnodes}", "--ntasks-per-node=1", *gpus,
            "--kill-on-bad-exit=1", "python", "-m", "attune.stacks.torchtitan.node_entry", "--slurm", "--",
            *launch.argv]


def run_on_worker(argv: list[str], env: dict[str, str], log_path: str, limits: dict[str, Any],
                  workdir: str, launcher: str = "direct", nnodes: int = 1, nproc_per_node: int = 1) -> dict[str, Any]:
    """The flow's body, callable without Prefect (tests, a login-node shell)."""
    if launcher == "slurm":
        launch = Launch(argv=argv, env=env, train_args=[], nnodes=nnodes, nproc_per_node=nproc_per_node)
        argv = srun_argv(launch)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    outcome = run_process(argv, env, log_path, RunLimits(**limits), cwd=workdir)
    return outcome.model_dump(mode="json")


def _flow():
    from prefect import flow

    @flow(name="attune-torchrun-trial", persist_result=True, log_prints=True)
    def torchrun_trial(argv: list[str], env: dict[str, str], log_path: str, limits: dict[str, Any], workdir: str,
                       launcher: str = "direct", nnodes: int = 1, nproc_per_node: int = 1) -> dict[str, Any]:
        return run_on_worker(argv, env, log_path, limits, workdir, launcher, nnodes, nproc_per_node)

    return torchrun_trial


def __getattr__(name: str) -> Any:
    # `prefect deploy` / `flow.serve` find the flow as attune.stacks.torchtitan.deployment:torchrun_trial;
    # built on first access so importing this module does not import Prefect.
    if name == "torchrun_trial":
        return _flow()
    raise AttributeError(name)


def pool_executor(deployment: str, launcher: str = "k8s", timeout_s: float | None = None):
    """An Executor for TorchtitanStack that runs each trial as a run of `deployment`
    ("attune-torchrun-trial/<deployment name>")."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")

    def execute(launch: Launch, log_path: Path, limits: RunLimits, workdir: Path) -> RunOutcome:
        from prefect.deployments import run_deployment
        parameters = {"argv": launch.argv, "env": launch.env, "log_path": str(log_path),
                      "limits": limits.model_dump(), "workdir": str(workdir), "launcher": launcher,
                      "nnodes": launch.nnodes, "nproc_per_node": launch.nproc_per_node}
        job_variables = {"nnodes": launch.nnodes, "gpus_per_node": launch.nproc_per_node,
                         "torchrun_argv": json.dumps(launch.argv), "trial_env": json.dumps(launch.env)}
        run = run_deployment(deployment, parameters=parameters, job_variables=job_variables if launcher == "k8s"
                             else None, timeout=timeout_s, as_subflow=False)
        state = run.state
        if state is None or not state.is_completed():
            name = state.name if state is not None else "unknown"
            return RunOutcome(status=TrialStatus.CRASH, returncode=None, wall_time_s=run.total_run_time.total_seconds(),
                              steps=[], message=f"flow run {run.id} ended {name}", log_path=str(log_path))
        outcome = RunOutcome(**state.result())
        # The GPUs were held for the pods' whole run, not only torchrun's: charge the longer.
        wall = max(outcome.wall_time_s, run.total_run_time.total_seconds())
        return outcome.model_copy(update={"wall_time_s": wall})

    return execute
