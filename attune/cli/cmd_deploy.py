"""`attune deploy`: register ATTUNE on a Prefect server, in the order the pieces need each other.

    1. work pools of deployments/pools.toml (created, or updated to the job templates in infra/)
    2. one tag concurrency limit per GPU pool (gpu-pool:<pool>): two campaigns never oversubscribe it
    3. `prefect deploy` of deployments/prefect.yaml, from the repo root (entrypoints are relative to it)

The server is PREFECT_API_URL (or --api-url); deploying to Prefect's throwaway ephemeral server would
register nothing anyone could see, so an unset URL is an error.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from attune.cli.common import emit
from attune.data_files import read_toml
from attune.errors import InputError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_IMAGE = "attune-worker:latest"  # what infra/compose.yaml builds from infra/docker/Dockerfile


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("deploy", help="register work pools, GPU-pool concurrency limits and deployments "
                                             "on a Prefect server")
    p.add_argument("--api-url", help="Prefect API URL (default: PREFECT_API_URL)")
    p.add_argument("--prefect-file", default=str(REPO / "deployments" / "prefect.yaml"))
    p.add_argument("--pools", default=str(REPO / "deployments" / "pools.toml"), help="work pools and GPU slots")
    p.add_argument("--name", action="append", default=[], metavar="DEPLOYMENT",
                   help="deploy only these (repeatable; default: every one whose entrypoint exists)")
    p.add_argument("--image", default=os.environ.get("ATTUNE_WORKER_IMAGE", DEFAULT_IMAGE),
                   help=f"worker image of the Kubernetes deployments (default $ATTUNE_WORKER_IMAGE or {DEFAULT_IMAGE})")
    p.add_argument("--no-deployments", action="store_true", help="pools and concurrency limits only")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    api_url = args.api_url or os.environ.get("PREFECT_API_URL")
    if not api_url:
        raise InputError("--api-url", "no Prefect server: set PREFECT_API_URL or pass --api-url "
                                      "(e.g. http://127.0.0.1:4200/api)")
    pools, slots = load_pools(Path(args.pools))
    prefect_file = Path(args.prefect_file).resolve()
    root = prefect_file.parent.parent  # entrypoints in prefect.yaml are relative to the repo root
    wanted, skipped = deployments_to_register(prefect_file, root, args.name)
    report: dict[str, Any] = {"api_url": api_url, "pools": [], "concurrency_limits": {}, "deployments": [],
                              "skipped": skipped}
    with _client(api_url) as client:
        report["pools"] = ensure_pools(client, pools)
        report["concurrency_limits"] = ensure_gpu_limits(client, slots)
    for name, why in skipped.items():
        print(f"attune deploy: skipped {name}: {why}", file=sys.stderr)
    if not args.no_deployments and wanted:
        prefect_deploy(prefect_file, root, wanted, api_url, args.image)
        report["deployments"] = wanted
    emit(report, args.json, _text(report))
    return 0


# --- what to create ---------------------------------------------------------------------------
def load_pools(path: Path) -> tuple[list[dict[str, Any]], dict[str, int]]:
    raw = read_toml(path)
    pools = []
    for pool in raw.get("pool", []):
        if not pool.get("name") or not pool.get("type"):
            raise InputError(f"{path}: pool", "every [[pool]] needs a name and a type")
        template = None
        if pool.get("base_job_template"):
            template_path = (path.parent / pool["base_job_template"]).resolve()
            if not template_path.is_file():
                raise InputError(f"{path}: pool {pool['name']}", f"job template not found: {template_path}")
            template = json.loads(template_path.read_text())
        pools.append({"name": pool["name"], "type": pool["type"], "description": pool.get("description"),
                      "base_job_template": template})
    slots = raw.get("gpu_slots", {})
    for pool, n in slots.items():
        if not isinstance(n, int) or n < 1:
            raise InputError(f"{path}: gpu_slots.{pool}", f"must be a positive integer, got {n!r}")
    return pools, dict(slots)


def deployments_to_register(prefect_file: Path, root: Path, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Deployment names to pass to `prefect deploy`, and those skipped with the reason (an entrypoint
    another part of ATTUNE has not written yet must not block the rest)."""
    import yaml

    if not prefect_file.is_file():
        raise InputError("--prefect-file", f"not found: {prefect_file}")
    declared = yaml.safe_load(prefect_file.read_text()).get("deployments") or []
    known = {d["name"]: d for d in declared}
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise InputError("--name", f"not in {prefect_file.name}: {', '.join(unknown)}; known: {', '.join(known)}")
    wanted, skipped = [], {}
    for name in names or list(known):
        source = known[name]["entrypoint"].rsplit(":", 1)[0]
        if not (root / source).is_file():
            skipped[name] = f"{source} does not exist"
        else:
            wanted.append(name)
    return wanted, skipped


# --- the server ---------------------------------------------------------------------------------
def _client(api_url: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    class _Session:
        def __enter__(self):
            self._settings = temporary_settings(updates={PREFECT_API_URL: api_url})
            self._settings.__enter__()
            self._client = get_client(sync_client=True)
            return self._client.__enter__()

        def __exit__(self, *exc):
            try:
                self._client.__exit__(*exc)
            finally:
                self._settings.__exit__(*exc)

    return _Session()


def ensure_pools(client, pools: list[dict[str, Any]]) -> list[str]:
    from prefect.client.schemas.actions import WorkPoolCreate

    done = []
    for pool in pools:
        fields = {k: v for k, v in pool.items() if v is not None}
        client.create_work_pool(WorkPoolCreate(**fields), overwrite=True)  # a re-deploy updates the template
        done.append(pool["name"])
    return done


def ensure_gpu_limits(client, slots: dict[str, int]) -> dict[str, int]:
    # Tag limits (not a global limit the code would have to acquire): run-trial tasks already carry
    # gpu-pool:<pool>, and Prefect holds each such task until a slot of its tag is free.
    done = {}
    for pool, n in slots.items():
        client.create_concurrency_limit(tag=f"gpu-pool:{pool}", concurrency_limit=n)  # an upsert
        done[f"gpu-pool:{pool}"] = n
    return done


def prefect_deploy(prefect_file: Path, root: Path, names: list[str], api_url: str, image: str) -> None:
    argv = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--prefect-file", str(prefect_file)]
    for name in names:
        argv += ["--name", name]
    env = dict(os.environ, PREFECT_API_URL=api_url, ATTUNE_WORKER_IMAGE=image)
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise InputError("prefect deploy", f"exited {proc.returncode}:\n{tail}")


def _text(report: dict[str, Any]) -> str:
    lines = [f"Prefect server {report['api_url']}",
             f"  work pools: {', '.join(report['pools']) or '-'}",
             "  GPU-pool limits: " + (", ".join(f"{k}={v}" for k, v in report["concurrency_limits"].items()) or "-"),
             f"  deployments: {', '.join(report['deployments']) or '-'}"]
    lines += [f"  skipped {name}: {why}" for name, why in report["skipped"].items()]
    return "\n".join(lines)
