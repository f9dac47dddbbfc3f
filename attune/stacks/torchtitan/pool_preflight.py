"""Checks a campaign makes before its first pooled trial: a work pool that cannot run the trials
must cost nothing but one clear line (attune.errors.InputError: exit 2 from the CLI).

  server      PREFECT_API_URL is set and answers (a pool's worker polls a real server, never
              the throwaway one `attune tune` starts for local runs)
  deployment  the deployment exists ("attune-torchrun-trial/<name>"; known ones are listed)
  pool        its work pool exists and has a worker online (else nobody would pick the run up)
  nodes       on Slurm, the partition the pool allocates from has the nodes the recipe asks for
              (checked where `sinfo` reaches the cluster, as on a login node; skipped elsewhere)
"""

from __future__ import annotations

from typing import Any

from attune.errors import InputError
from attune.stacks.torchtitan import slurm_job

WHERE = "ATTUNE_TORCHTITAN_DEPLOYMENT"


def check_pool(deployment: str, launcher: str | None, nnodes: int) -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    if not api_url:
        raise InputError("PREFECT_API_URL", f"{WHERE}={deployment} runs trials on a work pool: point "
                                            "PREFECT_API_URL at the Prefect server its worker polls")
    with get_client(sync_client=True) as client:
        try:
            client.hello()
        except Exception as err:  # noqa: BLE001  (any failure to connect is the same answer to the user)
            raise InputError("PREFECT_API_URL", f"no Prefect server answers at {api_url} "
                                                f"({type(err).__name__})") from None
        try:
            found = client.read_deployment_by_name(deployment)
        except (ObjectNotFound, ValueError):
            known = sorted(f"{_flow_name(client, d.flow_id)}/{d.name}" for d in client.read_deployments())
            raise InputError(WHERE, f"no deployment {deployment!r} on {api_url}; known: "
                                    f"{', '.join(known) or 'none (run attune deploy)'}") from None
        pool_name = found.work_pool_name
        if not pool_name:
            raise InputError(WHERE, f"deployment {deployment!r} has no work pool")
        try:
            pool = client.read_work_pool(pool_name)
        except ObjectNotFound:
            raise InputError("work pool", f"{pool_name!r} (of deployment {deployment!r}) does not exist "
                                          "on the server: run attune deploy") from None
        workers = client.read_workers_for_work_pool(pool_name)
        if not any(str(getattr(w.status, "value", w.status)).upper() == "ONLINE" for w in workers):
            raise InputError("work pool", f"{pool_name!r} has no worker online to run trials: start one "
                                          "(infra/slurm/start-worker.sh on a Slurm login node)")
    if launcher == "slurm":
        partition = _partition(found.job_variables or {}, pool.base_job_template or {})
        have = slurm_job.partition_nodes(partition)
        if have is not None and nnodes > have:
            raise InputError("recipe cluster", f"the recipe needs {nnodes} nodes and Slurm partition "
                                               f"{partition or '(default)'} has {have}")


def _flow_name(client, flow_id) -> str:
    try:
        return client.read_flow(flow_id).name
    except Exception:  # noqa: BLE001
        return "?"


def _partition(job_variables: dict[str, Any], template: dict[str, Any]) -> str | None:
    """The partition srun allocates from: the deployment's job variable, else the template's default."""
    if job_variables.get("partition"):
        return str(job_variables["partition"])
    spec = template.get("variables", {}).get("properties", {}).get("partition", {})
    return spec.get("default") or None
