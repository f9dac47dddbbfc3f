"""`attune deploy`: register ATTUNE on a Prefect server, in the order the pieces need each other.

    1. work pools of deployments/pools.toml (created, or updated to the job templates in infra/)
    2. one tag concurrency limit per GPU pool (gpu-pool:<pool>): two campaigns never oversubscribe it
    3. `prefect deploy` of deployments/prefect.yaml, from the repo root (entrypoints are relative to it)
    4. with --result-storage s3://BUCKET/PREFIX: the S3 result-storage block trial results travel
       through (worker and campaign rarely share a disk); workers run with
       PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK=s3-bucket/attune-results

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
    p.add_argument("--api-url", metavar="URL", help="Prefect API URL (default: $PREFECT_API_URL)")
    p.add_argument("--prefect-file", default=str(REPO / "deployments" / "prefect.yaml"), metavar="FILE",
                   help="the deployments to register (default: deployments/prefect.yaml of the checkout)")
    p.add_argument("--pools", default=str(REPO / "deployments" / "pools.toml"), metavar="FILE",
                   help="work pools and GPU slots (default: deployments/pools.toml of the checkout)")
    p.add_argument("--name", action="append", default=[], metavar="DEPLOYMENT",
                   help="deploy only these (repeatable; default: every one whose entrypoint exists)")
    p.add_argument("--image", default=os.environ.get("ATTUNE_WORKER_IMAGE", DEFAULT_IMAGE),
                   help=f"worker image of the Kubernetes deployments (default $ATTUNE_WORKER_IMAGE or {DEFAULT_IMAGE})")
    p.add_argument("--no-deployments", action="store_true", help="pools and concurrency limits only")
    p.add_argument("--result-storage", metavar="S3_URL",
                   help="s3://BUCKET/PREFIX: create the result-storage block s3-bucket/attune-results there "
                        "(credentials from the usual AWS variables; the bucket must exist)")
    p.add_argument("--s3-endpoint-url", metavar="URL", default=os.environ.get("AWS_ENDPOINT_URL_S3")
                   or os.environ.get("AWS_ENDPOINT_URL"),
                   help="S3 endpoint of --result-storage (default $AWS_ENDPOINT_URL_S3 or $AWS_ENDPOINT_URL: AWS)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    api_url = args.api_url or os.environ.get("PREFECT_API_URL")
    if not api_url:
        raise InputError("--api-url", "no Prefect server: set PREFECT_API_URL or pass --api-url "
                                      "(e.g. http://127.0.0.1:4200/api)")
    pools, slots = load_pools(Path(args.pools))
    storage = check_result_storage(args.result_storage, args.s3_endpoint_url) if args.result_storage else None
    prefect_file = Path(args.prefect_file).resolve()
    root = prefect_file.parent.parent  # entrypoints in prefect.yaml are relative to the repo root
    wanted, skipped = deployments_to_register(prefect_file, root, args.name)
    report: dict[str, Any] = {"api_url": api_url, "pools": [], "concurrency_limits": {}, "deployments": [],
                              "skipped": skipped, "result_storage": None}
    with _client(api_url) as client:
        report["pools"] = ensure_pools(client, pools)
        report["concurrency_limits"] = ensure_gpu_limits(client, slots)
    if storage is not None:
        report["result_storage"] = ensure_result_storage(api_url, *storage)
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


RESULT_BLOCK = "attune-results"


def check_result_storage(url: str, endpoint_url: str | None) -> tuple[str, str, str | None]:
    """(bucket, prefix, endpoint) of an s3:// URL whose bucket answers; InputError otherwise."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from attune.store import parse_s3_url

    bucket, prefix = parse_s3_url(url, "--result-storage")
    try:
        boto3.client("s3", endpoint_url=endpoint_url).head_bucket(Bucket=bucket)
    except (BotoCoreError, ClientError) as err:  # the message names the bucket, never the credentials
        raise InputError("--result-storage", f"bucket {bucket!r} is not reachable at "
                                             f"{endpoint_url or 'AWS'}: {type(err).__name__}") from None
    return bucket, prefix, endpoint_url


def ensure_result_storage(api_url: str, bucket: str, prefix: str, endpoint_url: str | None) -> str:
    """Save the S3Bucket block (its credentials in an AwsCredentials block, stored as secrets by
    Prefect) and return its slug for PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK."""
    import boto3
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_aws import AwsCredentials, S3Bucket
    from prefect_aws.client_parameters import AwsClientParameters

    found = boto3.Session().get_credentials()
    frozen = found.get_frozen_credentials() if found is not None else None
    credentials = AwsCredentials(
        aws_access_key_id=frozen.access_key if frozen else None,
        aws_secret_access_key=frozen.secret_key if frozen else None,
        aws_session_token=frozen.token if frozen else None,
        region_name=boto3.Session().region_name,
        aws_client_parameters=AwsClientParameters(endpoint_url=endpoint_url) if endpoint_url else AwsClientParameters())
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        S3Bucket(bucket_name=bucket, bucket_folder=prefix, credentials=credentials).save(RESULT_BLOCK, overwrite=True)
    return f"{S3Bucket.get_block_type_slug()}/{RESULT_BLOCK}"


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
    if report.get("result_storage"):
        lines.append(f"  result storage: {report['result_storage']} (run workers with "
                     f"PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK={report['result_storage']})")
    lines += [f"  skipped {name}: {why}" for name, why in report["skipped"].items()]
    return "\n".join(lines)
