"""The thin Prefect part: the worker-side flow body, the executor's deployment-run call, the node
entry's rendezvous endpoint, and the work-pool job templates in infra/."""

from __future__ import annotations

import datetime as dt
import json
import sys
import types

import pytest
from conftest import REPO

from attune.stacks.base import TrialStatus
from attune.stacks.torchtitan import deployment, node_entry
from attune.stacks.torchtitan.render import Launch
from attune.stacks.torchtitan.runner import RunLimits

LAUNCH = Launch(argv=["torchrun", "--nnodes", "2", "-m", "torchtitan.train"], env={"NCCL_DEBUG": "WARN"},
                train_args=[], nnodes=2, nproc_per_node=8)


def test_flow_body_runs_the_argv_on_the_worker(tmp_path):
    out = deployment.run_on_worker([sys.executable, "-c", "print('hello')"], {}, str(tmp_path / "w.log"),
                                   RunLimits().model_dump(), str(tmp_path))
    assert out["returncode"] == 0 and (tmp_path / "w.log").read_text() == "hello\n"


def test_slurm_launcher_wraps_torchrun_in_srun():
    argv = deployment.srun_argv(LAUNCH)
    assert argv[:3] == ["srun", "--nodes=2", "--ntasks-per-node=1"] and "--gpus-per-node=8" in argv
    assert argv[argv.index("--") + 1:] == LAUNCH.argv


def test_pool_executor_runs_the_deployment_with_job_variables(monkeypatch, tmp_path):
    calls = {}
    outcome = {"status": "ok", "returncode": 0, "wall_time_s": 50.0, "steps": [], "message": "5 steps",
               "log_path": "x", "stopped": None}

    def fake_run_deployment(name, parameters, job_variables, timeout, as_subflow):
        calls.update(name=name, parameters=parameters, job_variables=job_variables, timeout=timeout)
        return types.SimpleNamespace(id="run-1", state=None, total_run_time=dt.timedelta(0))

    state = types.SimpleNamespace(is_completed=lambda: True, result=lambda: outcome, name="Completed")
    finished = types.SimpleNamespace(id="run-1", state=state, total_run_time=dt.timedelta(seconds=80))

    # the Kubernetes pool's job variables (no cluster here); the real path runs in test_slurm_pool.py
    import prefect.deployments
    monkeypatch.setattr(prefect.deployments, "run_deployment", fake_run_deployment)
    monkeypatch.setattr(deployment, "follow_flow_run", lambda run_id, timeout_s, **_: (finished, None, 80.0))
    result = deployment.pool_executor("attune-torchrun-trial/gpu-k8s")(LAUNCH, tmp_path / "t.log", RunLimits(), tmp_path)
    assert result.status == TrialStatus.OK and result.wall_time_s == 80.0  # the pods' run time is charged
    assert calls["job_variables"]["nnodes"] == 2 and json.loads(calls["job_variables"]["torchrun_argv"]) == LAUNCH.argv
    assert calls["parameters"]["launcher"] == "k8s"
    assert calls["timeout"] == 0  # submitted, then followed (and cancelled on a stop) by follow_flow_run, not waited on


def test_node_entry_sets_the_rendezvous_endpoint(monkeypatch):
    ran = {}
    for var in ("PET_RDZV_ENDPOINT", "PET_RDZV_CONF", "NCCL_DEBUG"):  # node_entry writes these: restored after
        monkeypatch.setenv(var, "unset")
    monkeypatch.setattr(node_entry.os, "execvp", lambda prog, argv: ran.update(argv=argv))
    monkeypatch.setenv("JOB_NAME", "trial-abc")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    monkeypatch.setenv("ATTUNE_TORCHRUN_ARGV", json.dumps(LAUNCH.argv))
    monkeypatch.setenv("ATTUNE_TRIAL_ENV", json.dumps({"NCCL_DEBUG": "WARN"}))
    node_entry.main(["--k8s", "--", "prefect", "flow-run", "execute"])
    assert ran["argv"] == LAUNCH.argv and node_entry.os.environ["PET_RDZV_ENDPOINT"] == "trial-abc-0.attune-torchrun:29500"
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "0")
    node_entry.main(["--k8s", "--", "prefect", "flow-run", "execute"])
    assert ran["argv"] == ["prefect", "flow-run", "execute"]  # pod 0 runs the flow
    monkeypatch.setattr(node_entry, "slurm_head", lambda: "gpu-017")
    node_entry.main(["--slurm", "--", "torchrun", "--nnodes", "2"])
    assert node_entry.os.environ["PET_RDZV_ENDPOINT"] == "gpu-017:29500" and ran["argv"][0] == "torchrun"


def test_node_entry_makes_the_first_slurm_node_the_c10d_host():
    assert node_entry.host_conf(None, True) == "is_host=1"
    assert node_entry.host_conf("read_timeout=120", False) == "read_timeout=120,is_host=0"
    assert node_entry.host_conf("is_host=0", True) == "is_host=0"  # the caller's decision stands


def test_a_cpu_launch_asks_srun_for_no_gpus():
    from attune.recipe import load_recipe
    from attune.stacks.torchtitan.render import render_launch
    launch = render_launch(load_recipe(REPO / "recipes/cpu/llama3_debug_2node.toml"), rdzv_endpoint="env")
    argv = deployment.srun_argv(launch)
    assert argv[:3] == ["srun", "--nodes=2", "--ntasks-per-node=1"]
    assert not [a for a in argv[:argv.index("--")] if a.startswith("--gpus")]


@pytest.mark.parametrize("path", ["infra/k8s/torchrun-job-template.json", "infra/slurm/process-job-template.json"])
def test_job_templates_are_prefect_base_job_templates(path):
    template = json.loads((REPO / path).read_text())
    assert set(template) == {"job_configuration", "variables"}
    assert template["job_configuration"]["command"] == "{{ command }}"
    if "k8s" in path:
        spec = template["job_configuration"]["job_manifest"]["spec"]
        assert spec["completions"] == spec["parallelism"] == "{{ nnodes }}" and spec["completionMode"] == "Indexed"
        for var in ("nnodes", "gpus_per_node", "torchrun_argv", "trial_env", "image"):
            assert var in template["variables"]["properties"]


def test_a_pooled_run_is_lost_once_nobody_could_still_be_running_it():
    limits = RunLimits(startup_timeout_s=90, stall_timeout_s=20, grace_s=20)
    state = lambda kind: types.SimpleNamespace(state=types.SimpleNamespace(type=types.SimpleNamespace(value=kind)))  # noqa: E731
    assert deployment._lost(state("PENDING"), limits, waited_s=60, quiet_s=60, stepped=False) is None
    assert "no worker started" in deployment._lost(state("PENDING"), limits, waited_s=91, quiet_s=0, stepped=False)
    # before the first step the runner waits out the start-up timeout; after it, the stall timeout
    assert deployment._lost(state("RUNNING"), limits, waited_s=200, quiet_s=139, stepped=False) is None
    assert deployment._lost(state("RUNNING"), limits, waited_s=200, quiet_s=141, stepped=False).startswith(deployment.LOST)
    assert deployment._lost(state("RUNNING"), limits, waited_s=200, quiet_s=71, stepped=True).startswith(deployment.LOST)
    assert deployment._lost(state("RUNNING"), limits, waited_s=200, quiet_s=69, stepped=True) is None
    assert deployment._lost(state("RUNNING"), None, waited_s=1e6, quiet_s=1e6, stepped=True) is None
