"""Deployment files checked without a server: prefect.yaml against the flows and pools it names,
the pools file against infra/, the compose file's shape, and `attune deploy`'s refusals.
(tests/test_nightly_server.py deploys all of it on a real `prefect server`.)"""

from __future__ import annotations

import inspect
import os

import pytest
import yaml
from conftest import REPO, assert_one_line_error

from attune.cli.cmd_deploy import deployments_to_register, load_pools

PREFECT_YAML = REPO / "deployments" / "prefect.yaml"
POOLS = REPO / "deployments" / "pools.toml"


def _deployments() -> dict[str, dict]:
    return {d["name"]: d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]}


def test_every_deployment_names_a_known_pool_and_an_existing_flow():
    pools, _ = load_pools(POOLS)
    names = {p["name"] for p in pools}
    for name, d in _deployments().items():
        assert d["work_pool"]["name"] in names, name
        source, func = d["entrypoint"].rsplit(":", 1)
        text = (REPO / source).read_text()
        assert f"def {func}(" in text or f"\"{func}\"" in text, (name, d["entrypoint"])


def test_campaign_and_nightly_parameters_are_flow_parameters():
    from attune.flows.campaign import tune_campaign
    from attune.flows.nightly import nightly_retune

    flows = {"flows/campaign.py:tune_campaign": tune_campaign, "flows/nightly.py:nightly_retune": nightly_retune}
    for name, d in _deployments().items():
        if d["entrypoint"] in flows:
            accepted = set(inspect.signature(flows[d["entrypoint"]].fn).parameters)
            assert set(d.get("parameters", {})) <= accepted, name


def test_nightly_is_scheduled_at_2am_with_its_time_zone_and_never_overlaps():
    nightly = _deployments()["nightly"]
    (schedule,) = nightly["schedules"]
    assert schedule["cron"] == "0 2 * * *" and schedule["timezone"]
    assert nightly["parameters"]["timezone"] == schedule["timezone"]  # "tonight" is the schedule's night
    assert nightly["concurrency_limit"] == 1
    assert (REPO / nightly["parameters"]["registry"]).is_file()


def test_pools_use_the_infra_job_templates_and_every_gpu_pool_has_slots():
    pools, slots = load_pools(POOLS)
    by_name = {p["name"]: p for p in pools}
    k8s = by_name["attune-gpu-k8s"]
    assert k8s["type"] == "kubernetes"
    spec = k8s["base_job_template"]["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpus_per_node }}"
    assert by_name["attune-gpu-slurm"]["type"] == "process"
    assert set(slots) >= {"attune-gpu-k8s", "attune-gpu-slurm", "sim"} and all(n >= 1 for n in slots.values())


def test_missing_entrypoints_are_skipped_not_fatal(tmp_path):
    folder = tmp_path / "deployments"
    folder.mkdir()
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "a.py").write_text("def a(): ...\n")
    path = folder / "prefect.yaml"
    path.write_text("deployments:\n  - {name: a, entrypoint: flows/a.py:a}\n  - {name: b, entrypoint: flows/b.py:b}\n")
    wanted, skipped = deployments_to_register(path, tmp_path, [])
    assert wanted == ["a"] and "flows/b.py" in skipped["b"]


def test_deploy_refuses_without_a_server(cli):
    env_url = os.environ.pop("PREFECT_API_URL", None)
    try:
        assert_one_line_error(cli("deploy"), "PREFECT_API_URL")
    finally:
        if env_url is not None:
            os.environ["PREFECT_API_URL"] = env_url


def test_deploy_refuses_unknown_deployment_names(cli):
    assert_one_line_error(cli("deploy", "--api-url", "http://127.0.0.1:9/api", "--name", "nope"), "--name")


def test_compose_is_the_documented_self_hosted_stack():
    compose = yaml.safe_load((REPO / "infra" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "prefect-server", "mlflow", "minio", "worker", "deploy"} <= set(services)
    for name, s in services.items():
        for port in s.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)   # loopback only
    assert "postgresql+asyncpg://" in services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert "postgresql://" in services["mlflow"]["command"] and "s3://" in services["mlflow"]["command"]
    assert services["worker"]["build"]["dockerfile"] == "infra/docker/Dockerfile"
    init = (REPO / "infra" / "docker" / "postgres-init.sql").read_text()
    assert "CREATE DATABASE prefect" in init and "CREATE DATABASE mlflow" in init


@pytest.mark.parametrize("path", ["infra/docker/Dockerfile", "infra/README.md"])
def test_infra_files_exist(path):
    assert (REPO / path).is_file()
