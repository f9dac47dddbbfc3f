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
The flow's result must reach the caller: give the worker shared result storage (the S3 block that
`attune deploy --result-storage s3://...` creates, as PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK) when
worker and campaign do not share a disk.

The caller follows its flow run instead of blocking on it: a stop (Ctrl-C, SIGTERM, a cancel of the
campaign) cancels the trial's flow run, whose worker then ends the flow's process; the flow ends
srun, and srun the allocation. A Prefect server that is briefly unreachable (a restart) is waited
out for SERVER_PATIENCE_S. On Slurm the trial is charged for the allocation's elapsed time as Slurm
reports it where that is longer than what the flow measured (slurm_job.py).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from attune import interrupt
from attune.stacks.base import TrialStatus
from attune.stacks.torchtitan import slurm_job
from attune.stacks.torchtitan.log_parser import STOP_ASKED, parse_metrics_line
from attune.stacks.torchtitan.render import CPU_MODULE, Launch
from attune.stacks.torchtitan.runner import RunLimits, RunOutcome, run_process

LAUNCHERS = ("k8s", "slurm", "direct")
POLL_S = 1.0
SERVER_PATIENCE_S = 180.0   # how long an unreachable Prefect server is waited for before the trial counts as lost
CANCEL_PATIENCE_S = 60.0    # after cancelling its flow run, how long to wait for the run to end
LOST = "lost:"              # how follow_flow_run's reason starts when the run's worker or process died


def srun_argv(launch: Launch) -> list[str]:
    """The torchrun argv run on every node of the Slurm allocation by srun (one task per node).
    A CPU launch (torchtitan's CPU module: a process is a "GPU") asks for no GPUs."""
    gpus = [] if CPU_MODULE in launch.argv else [f"--gpus-per-node={launch.nproc_per_node}"]
    return ["srun", f"--nodes={launch.nnodes}", "--ntasks-per-node=1", *gpus,
            "--kill-on-bad-exit=1", sys.executable, "-m", "attune.stacks.torchtitan.node_entry", "--slurm", "--",
            *launch.argv]


def run_on_worker(argv: list[str], env: dict[str, str], log_path: str, limits: dict[str, Any],
                  workdir: str, launcher: str = "direct", nnodes: int = 1, nproc_per_node: int = 1) -> dict[str, Any]:
    """The flow's body, callable without Prefect (tests, a login-node shell). SIGTERM (the worker
    cancelling the flow run) ends the trainers and the allocation instead of orphaning them."""
    Path(workdir).mkdir(parents=True, exist_ok=True)
    if launcher == "slurm":
        launch = Launch(argv=argv, env=env, train_args=[], nnodes=nnodes, nproc_per_node=nproc_per_node)
        argv = srun_argv(launch)
        (Path(workdir) / slurm_job.JOB_ID_FILE).unlink(missing_ok=True)  # a retry's folder holds the last one's
    with interrupt.stop_on_signals():
        outcome = run_process(argv, env, log_path, RunLimits(**limits), cwd=workdir)
    if launcher == "slurm":
        outcome = _charge_allocation(outcome, Path(workdir))
    return outcome.model_dump(mode="json")


def _charge_allocation(outcome: RunOutcome, workdir: Path) -> RunOutcome:
    """Release the allocation if srun left it behind, and charge Slurm's elapsed time where longer."""
    job_id = slurm_job.recorded_job_id(workdir)
    if job_id is None:   # srun never started a task (refused, or no node came up): nothing was held
        return outcome
    if outcome.stopped:   # the runner ended srun: make sure the allocation goes with it
        slurm_job.cancel(job_id)
    deadline = time.monotonic() + 30
    while slurm_job.still_listed(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    if slurm_job.still_listed(job_id):
        slurm_job.cancel(job_id)
    elapsed = slurm_job.elapsed_s(job_id)
    wall = max(outcome.wall_time_s, elapsed or 0.0)
    return outcome.model_copy(update={"allocation": f"slurm job {job_id}", "allocation_s": elapsed,
                                      "wall_time_s": wall})


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
        submitted = run_deployment(deployment, parameters=parameters, job_variables=job_variables
                                   if launcher == "k8s" else None, timeout=0, as_subflow=False)
        run, why, active_s = follow_flow_run(submitted.id, timeout_s, log_path=log_path, limits=limits)
        state = run.state if run is not None else None
        ran_s = run.total_run_time.total_seconds() if run is not None else 0.0
        if state is None or not state.is_completed():
            if why and why.startswith(LOST):   # it stopped running when its log stopped: charge to then
                ran_s = min(ran_s, active_s) if ran_s else active_s
                job = slurm_job.recorded_job_id(Path(workdir))
                if job is not None:   # where this machine reaches Slurm (a login node): release it now
                    slurm_job.cancel(job)
            name = state.name if state is not None else "unknown"
            return RunOutcome(status=TrialStatus.CRASH, returncode=None, wall_time_s=ran_s, steps=[],
                              message=f"flow run {submitted.id} ended {name}" + (f" ({why})" if why else ""),
                              log_path=str(log_path), stopped=why if why and why.startswith(STOP_ASKED) else None)
        outcome = RunOutcome(**state.result())
        # The GPUs were held for the pods' whole run, not only torchrun's: charge the longer.
        wall = max(outcome.wall_time_s, ran_s)
        return outcome.model_copy(update={"wall_time_s": wall})

    return execute


def follow_flow_run(flow_run_id, timeout_s: float | None = None, log_path: Path | None = None,
                    limits: RunLimits | None = None):
    """Poll the flow run until it is final: (the run, why it was given up or cancelled or None,
    seconds from submission to the trial log's last growth). A stop request cancels it (and waits
    CANCEL_PATIENCE_S for it to end); a server unreachable for SERVER_PATIENCE_S, or timeout_s
    passing, gives it up. With limits, a run no worker starts within the start-up timeout, or a
    running one whose log (on the storage both sides see) has been quiet for longer than the runner
    itself would allow, is lost (its worker or flow process died) and cancelled."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Cancelling

    started = time.monotonic()
    last_seen, run, why, cancelled_at = started, None, None, None
    log_size, progress_at, stepped = -1, started, False
    with get_client(sync_client=True) as client:
        while True:
            now = time.monotonic()
            try:
                run = client.read_flow_run(flow_run_id)
                last_seen = now
            except Exception as err:  # noqa: BLE001  (a restarting server: connection refused, 5xx)
                if now - last_seen > SERVER_PATIENCE_S:
                    why = f"the Prefect server was unreachable for {SERVER_PATIENCE_S:.0f} s ({err})"
                    return run, why, progress_at - started
            if run is not None and run.state is not None and run.state.is_final():
                return run, why, progress_at - started
            size = log_path.stat().st_size if log_path is not None and log_path.exists() else -1
            if size != log_size:
                log_size, progress_at = size, now
                stepped = stepped or (size > 0 and any(
                    parse_metrics_line(line) for line in log_path.read_text(errors="replace").splitlines()))
            lost = _lost(run, limits, now - started, now - progress_at, stepped) if cancelled_at is None else None
            if (interrupt.requested() or lost) and cancelled_at is None:
                why = why or lost or f"{STOP_ASKED} ({interrupt.requested()})"
                try:
                    client.set_flow_run_state(flow_run_id, Cancelling(message=why), force=True)
                    cancelled_at = now
                except Exception:  # noqa: BLE001  (unreachable: try again next poll)
                    pass
            if cancelled_at is not None and now - cancelled_at > CANCEL_PATIENCE_S:
                try:  # nobody ended it (its worker is gone): mark it ended so no one waits on it
                    client.set_flow_run_state(flow_run_id, Cancelled(message=why), force=True)
                except Exception:  # noqa: BLE001
                    pass
                return run, why, progress_at - started
            if timeout_s is not None and now - started > timeout_s:
                return run, f"no result after {timeout_s:.0f} s", progress_at - started
            time.sleep(POLL_S)


def _lost(run, limits: RunLimits | None, waited_s: float, quiet_s: float, stepped: bool) -> str | None:
    """Why a flow run that is not final counts as lost, or None. The runner on the worker ends a
    trial quiet for the stall (before its first step: the start-up) timeout itself; quiet for that
    plus its grace and a margin means nobody is running it."""
    if limits is None or run is None or run.state is None:
        return None
    if run.state.type.value in ("SCHEDULED", "PENDING") and waited_s > limits.startup_timeout_s:
        return f"{LOST} no worker started the run within {limits.startup_timeout_s:.0f} s"
    patience = (limits.stall_timeout_s if stepped else limits.startup_timeout_s) + limits.grace_s + 30.0
    if run.state.type.value == "RUNNING" and quiet_s > patience:
        return f"{LOST} the trial's log has been quiet for {quiet_s:.0f} s: its worker or flow process is gone"
    return None
