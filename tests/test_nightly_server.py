"""For real: `prefect server start` on loopback, `attune deploy` of deployments/prefect.yaml, a process
worker on attune-cpu, runs triggered through the API, MLflow on a SQLite file, the store in a folder.

One server, deploy and worker for the module (they are most of the time); each test triggers runs
and waits for them. Everything started here is stopped by pid (process groups) on teardown.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO
from prefect_server import Server, prefect_server, prefect_worker, spawn, tail

CAMPAIGN_S = 240   # per wait; a campaign on the sim stack takes seconds once its process has started

RECIPE = """
name = "{name}"
model = "llama3.1-8b"
[cluster]
accelerator = "{accel}"
gpus = {gpus}
[stack]
torch = "{torch}"
torchtitan = "0.3.0"
[torchtitan]
module = "llama3"
config = "llama3_8b"
[config]
"training.local_batch_size" = 2
"training.seq_len" = 8192
"activation_checkpoint.mode" = "selective"
"""


@dataclass
class Stack:
    server: Server
    worker_log: Path
    work: Path
    env: dict[str, str]

    @property
    def store(self) -> Path:
        return self.work / "store"

    @property
    def mlflow_db(self) -> Path:
        return self.work / "mlflow.db"

    def run(self, deployment: str, parameters: dict, name: str | None = None) -> str:
        found = self.server.api(f"deployments/name/{deployment}")
        body = {"parameters": parameters} | ({"name": name} if name else {})
        return self.server.api(f"deployments/{found['id']}/create_flow_run", body)["id"]

    def wait(self, flow_run_id: str) -> dict:
        return self.server.wait_flow_run(flow_run_id, CAMPAIGN_S, self.worker_log)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("nightly-server")
    with prefect_server(work) as server:
        env = server.client_env(ATTUNE_HOME=work / "attune-home", ATTUNE_STORE=work / "store",
                                MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}", PYTHONPATH=REPO,
                                MPLBACKEND="Agg", PREFECT_LOGGING_LEVEL="INFO")
        # `attune deploy` and the worker start together: each takes seconds of imports on its own.
        deploy = spawn([sys.executable, "-m", "attune.cli.main", "deploy", "--json"], env, work / "deploy.log", REPO)
        with prefect_worker(server, "attune-cpu", cwd=work, env=env) as worker:
            try:
                deploy.wait(timeout=240)
            except subprocess.TimeoutExpired:
                deploy.kill()
            assert deploy.returncode == 0, tail(work / "deploy.log")
            yield Stack(server=server, worker_log=worker.log_path, work=work, env=env)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_prefect_yaml_deploys_pools_limits_schedule(stack):
    api = stack.server.api
    deployments = {d["name"]: d for d in api("deployments/filter", {})}
    assert {"sim", "torchtitan", "nightly", "bench", "gpu-k8s", "gpu-slurm", "probe-k8s"} <= set(deployments)
    nightly = deployments["nightly"]
    (schedule,) = nightly["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *" and schedule["schedule"]["timezone"] == "UTC"
    assert deployments["gpu-k8s"]["work_pool_name"] == "attune-gpu-k8s"
    k8s = api("work_pools/attune-gpu-k8s")
    assert k8s["type"] == "kubernetes" and "nnodes" in k8s["base_job_template"]["variables"]["properties"]
    assert api("work_pools/attune-gpu-slurm")["base_job_template"]["job_configuration"]["env"]["SLURM_PARTITION"]
    limit = api("concurrency_limits/tag/gpu-pool:sim")
    assert limit["concurrency_limit"] == 1


def test_campaign_through_the_worker_waits_for_the_gpu_pool_then_ships(stack, tmp_path):
    """tune-campaign/sim triggered through the API. While another holder (standing in for the other
    campaign's running trial) has the one gpu-pool:sim slot, no trial of this campaign starts."""
    recipe = write(tmp_path / "a100.toml", RECIPE.format(name="camp-a100", accel="a100", gpus=8, torch="2.13.0"))
    lease = hold_slot(stack.server, "tag:gpu-pool:sim")
    # gate_steps 20: half the gate's default proxy steps, still enough for it to pass this candidate
    run = stack.run("tune-campaign/sim", {"recipe_path": str(recipe), "gpu_pool": "sim",
                                          "settings": {"budget_gpu_hours": 12, "replicates": 2, "steps_per_trial": 5,
                                                       "gate_steps": 20}})
    first = wait_for(lambda: trial_runs(stack.server, run), stack, "the campaign's first trial task")
    time.sleep(3)  # it is waiting for the slot, not merely slow
    assert all(t["start_time"] is None for t in trial_runs(stack.server, run)), "a trial ran while the pool was full"
    released = time.time()
    stack.server.api("v2/concurrency_limits/decrement-with-lease", {"lease_id": lease})
    final = stack.wait(run)
    assert final["state"]["type"] == "COMPLETED", (final["state"], tail(stack.worker_log))
    trials = trial_runs(stack.server, run)
    assert len(trials) >= 3 and first
    assert min(_ts(t["start_time"]) for t in trials) >= released - 0.5

    # MLflow (SQLite): the campaign's parent run, one nested run per trial and one per gate verdict
    db = sqlite3.connect(stack.mlflow_db)
    parents = db.execute("select r.run_uuid from runs r join tags t on t.run_uuid = r.run_uuid "
                         "where t.key = 'attune.campaign_id'").fetchall()
    assert len(parents) == 1
    parent = parents[0][0]
    nested = db.execute("select count(*) from tags where key = 'mlflow.parentRunId' and value = ?", (parent,))
    gates = db.execute("select count(*) from tags where key = 'attune.role' and value = 'gate'").fetchone()[0]
    assert gates >= 1 and nested.fetchone()[0] == len(trials) + gates
    # the store: the gated recipe, under the recipe's stack fingerprint (compile on A100s ships on the sim)
    message = final["state"]["message"] or ""
    assert "shipped" in message, message
    (entry,) = stack.store.glob("recipes/llama3.1-8b/a100x8/*/entry.json")
    stored = json.loads(entry.read_text())
    assert stored["gate_passed"] and stored["simulated"] and stored["mlflow_run_id"] == parent


def hold_slot(server: Server, name: str) -> str:
    reply = server.api("v2/concurrency_limits/increment-with-lease",
                       {"names": [name], "slots": 1, "mode": "concurrency", "lease_duration": 120})
    return reply["lease_id"]


def trial_runs(server: Server, flow_run_id: str) -> list[dict]:
    return server.api("task_runs/filter", {"task_runs": {"tags": {"all_": ["gpu-pool:sim"]}},
                                           "flow_runs": {"id": {"any_": [flow_run_id]}}})


def wait_for(probe, stack: Stack, what: str, timeout_s: float = CAMPAIGN_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise TimeoutError(f"no {what} after {timeout_s}s:\n{tail(stack.worker_log)}")


def _ts(value: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_nightly_twice_retunes_only_what_changed_and_fails_on_a_standing_regression(stack, tmp_path):
    """Three production recipes, shipped earlier (seeded in the store at what the sim measures):
    A's stack changes between the nights, B never changes, C's shipped throughput is 30% above what
    it measures now (a regression). Budgets let a campaign measure its baseline and stop, so these
    campaigns never reach the gate (the campaign test above runs the gate for real)."""
    from attune.campaign.budget import gpu_hours
    from attune.recipe import load_recipe
    from attune.stacks.sim import SimStack
    from attune.store import entry_for_recipe, open_store

    clusters = {"a": ("a100", 16), "b": ("h100", 16), "c": ("h100", 8)}
    paths, budgets = {}, {}
    store = open_store(str(stack.store))
    sim = SimStack()
    for name, (accel, gpus) in clusters.items():
        paths[name] = write(tmp_path / f"{name}.toml", RECIPE.format(name=f"prod-{name}", accel=accel, gpus=gpus,
                                                                     torch="2.13.0"))
        recipe = load_recipe(paths[name])
        measured = [sim.run_trial(recipe, 5, seed).tokens_per_sec_per_gpu for seed in (101, 102, 103)]
        tps = sum(measured) / 3 * (1.3 if name == "c" else 1.0)
        store.put(entry_for_recipe(recipe, tokens_per_sec_per_gpu=tps, gate_passed=True, simulated=True,
                                   measured_at="2026-11-01T02:00:00+00:00"))
        one = gpu_hours(gpus, sim.estimate_wall_time_s(recipe, 5))
        budgets[name] = 3.5 * one  # the re-measure (2 runs) + one or two baseline runs: never a search
    registry = write(tmp_path / "prod.toml", "[defaults]\nreplicates = 2\nsteps_per_trial = 5\n" + "".join(
        f'[[recipe]]\nname = "{n}"\npath = "{n}.toml"\nbudget_gpu_hours = {budgets[n]:.4f}\n' for n in clusters)
        # D cannot even be checked (12 GPUs are not whole 8-GPU nodes): recorded, the others still run
        + '[[recipe]]\nname = "d"\npath = "b.toml"\ncluster = "h100:12"\nbudget_gpu_hours = 1\n')

    first = night(stack, registry, "2026-12-01")
    assert first["tuned"] == {"c"}, first
    (paths["a"]).write_text(paths["a"].read_text().replace('torch = "2.13.0"', 'torch = "2.14.0"'))
    second = night(stack, registry, "2026-12-02")
    assert second["tuned"] == {"a"}, second          # only the changed recipe; C already tried this stack
    a_night2 = json.loads((stack.store / "nightly" / "a" / "latest.json").read_text())
    assert "warm_start" not in a_night2["campaign"]  # nothing of A was tuned before: a fresh campaign
    (paths["a"]).write_text(paths["a"].read_text().replace('torch = "2.14.0"', 'torch = "2.15.0"'))
    third = night(stack, registry, "2026-12-03")
    assert third["tuned"] == {"a"}, third
    a_night3 = json.loads((stack.store / "nightly" / "a" / "latest.json").read_text())
    # the re-tune starts from the last night's campaign of the same recipe (issue 37)
    assert a_night3["campaign"]["warm_start"]["source"] == Path(a_night2["campaign"]["campaign_dir"]).name

    for result in (first, second, third):            # C's regression stands: visible as a failed run
        message = result["state"]["message"]
        assert result["state"]["type"] == "FAILED" and "c: regressed" in message and "d: InputError" in message
    ledger = {n: json.loads((stack.store / "nightly" / n / "latest.json").read_text()) for n in [*clusters, "d"]}
    assert ledger["d"]["action"] == "failed" and "multiple of gpus_per_node" in ledger["d"]["error"]
    assert "stack changed" in a_night2["why"] and "torch 2.13.0 -> 2.14.0" in a_night2["why"]
    assert "torch 2.14.0 -> 2.15.0" in ledger["a"]["why"]
    assert ledger["a"]["campaign"]["stack"] == "sim" and ledger["a"]["tuned_fingerprint"] == ledger["a"]["fingerprint"]
    assert ledger["b"]["action"] == "none" and not ledger["b"]["remeasure"]["regressed"]
    assert ledger["c"]["open_regression"]["since"] == "2026-12-01"
    assert ledger["c"]["open_regression"]["retuned_night"] == "2026-12-01" and ledger["c"]["action"] == "none"
    change = ledger["c"]["remeasure"]["change"]
    assert -0.3 < change < -0.15
    artifacts = stack.server.api("artifacts/filter", {"artifacts": {"key": {"any_": ["nightly-regression-c"]}}})
    assert any(f"{change:+.1%}" in a["data"] and "Regression: c" in a["data"] for a in artifacts), artifacts
    db = sqlite3.connect(stack.mlflow_db)
    nights = db.execute("select count(*) from runs r join experiments e on e.experiment_id = r.experiment_id "
                        "where e.name = 'attune-nightly'").fetchone()[0]
    assert nights == 12                              # one run per recipe per night


def night(stack: Stack, registry: Path, date: str) -> dict:
    run = stack.run("nightly-retune/nightly", {"registry": str(registry), "night": date})
    final = stack.wait(run)
    subflows = stack.server.api("flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run]}}})
    tuned = {f["name"].removesuffix(f"-{date}") for f in subflows}
    return {"state": final["state"], "tuned": tuned, "subflows": [f["state"]["type"] for f in subflows]}
