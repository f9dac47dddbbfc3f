"""The trial subprocess for real, against a small script that prints torchtitan's metrics lines:
streaming, the measured-steps stop, stalls, crashes, OOM and NCCL endings; then TorchtitanStack
on top of it (TrialResult, median tps after warm-up, GPU-hour charging). Fast: about 5 s."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO

from attune.recipe import load_recipe
from attune.stacks.base import TrialStatus
from attune.stacks.torchtitan.runner import RunLimits, run_process
from attune.stacks.torchtitan.stack import TorchtitanStack

FAKE_TRAIN = textwrap.dedent('''
    import sys, time
    mode, delay = sys.argv[1], float(sys.argv[2])
    R, G, O, T, B, C, M, X = ("\\x1b[31m", "\\x1b[32m", "\\x1b[38;2;180;60;0m", "\\x1b[38;2;54;234;195m",
                              "\\x1b[34m", "\\x1b[36m", "\\x1b[35m", "\\x1b[39m")
    print("[rank0]:[titan] 2026-12-02 10:00:00,000 - root - INFO - Training starts at step 1", flush=True)
    for step in range(1, 41):
        tps = 100 if step <= 2 else 1000 + step      # the first steps compile: slow
        print(f"[rank0]:[titan] 2026-12-02 10:00:0{step % 10},000 - root - INFO - {R}step: {step:2}  "
              f"{G}loss: {10 - step / 10:8.5f}  {O}grad_norm: {1.5:7.4f}  {T}memory: {20.5:5.2f}GiB(25.63%)  "
              f"{B}tps: {tps:,}  {C}tflops: {123.45:,.2f}  {M}mfu: {12.48:.2f}%{X}", flush=True)
        if mode == "oom" and step == 3:
            print("[rank0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB", flush=True)
            sys.exit(1)
        if mode == "nccl" and step == 3:
            print("[rank0]:torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3366, "
                  "unhandled system error", flush=True)
            sys.exit(1)
        if mode == "crash" and step == 2:
            raise RuntimeError("boom in the trainer")
        if mode == "hang" and step == 2:
            time.sleep(60)
        if mode == "short" and step == 4:
            print("[rank0]:[titan] - root - INFO - Training completed", flush=True)
            sys.exit(0)
        time.sleep(delay)
''')


@pytest.fixture
def fake(tmp_path) -> Path:
    path = tmp_path / "fake_train.py"
    path.write_text(FAKE_TRAIN)
    return path


def _run(fake, tmp_path, mode, delay=0.01, **limits):
    return run_process([sys.executable, str(fake), mode, str(delay)], {"ATTUNE_TEST": "1"},
                       tmp_path / f"{mode}.log", RunLimits(**limits))


def test_streams_each_line_to_the_log_while_running(fake, tmp_path):
    seen_in_log = []

    def on_step(metrics):
        seen_in_log.append((metrics.step, f"step: {metrics.step:2}" in (tmp_path / "ok.log").read_text()))

    outcome = run_process([sys.executable, str(fake), "ok", "0.05"], {}, tmp_path / "ok.log",
                          RunLimits(measure_steps=4, warmup_steps=2), on_step=on_step)
    assert outcome.status == TrialStatus.OK and outcome.stopped.startswith("[attune] stopped: measured")
    assert [s for s, in_log in seen_in_log] == [1, 2, 3, 4, 5, 6] and all(in_log for _s, in_log in seen_in_log)
    assert len(outcome.steps) == 6 and outcome.wall_time_s < 5  # stopped long before step 40
    assert "[attune] stopped: measured" in (tmp_path / "ok.log").read_text()


def test_stall_is_a_timeout_and_the_process_group_is_stopped(fake, tmp_path):
    started = time.monotonic()
    outcome = _run(fake, tmp_path, "hang", stall_timeout_s=0.5, grace_s=1)
    assert outcome.status == TrialStatus.TIMEOUT and time.monotonic() - started < 5
    assert len(outcome.steps) == 2 and "no progress" in outcome.message


def test_startup_timeout_before_the_first_step(tmp_path):
    outcome = run_process([sys.executable, "-c", "import time; print('init', flush=True); time.sleep(30)"], {},
                          tmp_path / "slow.log", RunLimits(startup_timeout_s=0.5, grace_s=1))
    assert outcome.status == TrialStatus.TIMEOUT and outcome.steps == []


@pytest.mark.parametrize("mode,status,needle", [
    ("oom", TrialStatus.OOM, "CUDA out of memory"),
    ("nccl", TrialStatus.NCCL_ERROR, "NCCL error"),
    ("crash", TrialStatus.CRASH, "RuntimeError: boom in the trainer"),
])
def test_endings_are_classified(fake, tmp_path, mode, status, needle):
    outcome = _run(fake, tmp_path, mode)
    assert outcome.status == status and needle in outcome.message
    assert outcome.returncode == 1 and outcome.steps


def test_missing_program_is_a_crash_not_an_exception(tmp_path):
    outcome = run_process(["/nonexistent/torchrun"], {}, tmp_path / "x.log")
    assert outcome.status == TrialStatus.CRASH and "could not start" in outcome.message


def _local_recipe(tmp_path):
    """A one-GPU llama3 debug-model recipe (the stack refuses multi-node launches locally)."""
    spec = tmp_path / "debug.json"
    spec.write_text('{"name": "llama3-debug", "n_layers": 6, "dim": 256, "n_heads": 16, "n_kv_heads": 16, '
                    '"head_dim": 16, "ffn_dim": 768, "vocab_size": 2048}')
    path = tmp_path / "debug.toml"
    path.write_text(textwrap.dedent(f'''
        name = "debug"
        model_spec = "{spec}"
        [cluster]
        accelerator = "h100"
        gpus = 1
        [stack]
        torch = "2.13.0"
        torchtitan = "0.3.0"
        [torchtitan]
        module = "llama3"
        config = "llama3_debugmodel"
        [config]
        "training.local_batch_size" = 8
        "training.seq_len" = 2048
        "activation_checkpoint.mode" = "selective"
    '''))
    return load_recipe(path)


def test_stack_runs_a_trial_and_charges_gpus_times_wall_time(fake, tmp_path):
    seen = {}

    def executor(launch, log_path, limits, workdir):
        seen["launch"] = launch
        return run_process([sys.executable, str(fake), "ok", "0.01"], launch.env, log_path, limits)

    stack = TorchtitanStack(executor=executor, warmup_steps=2, validate=False, smoke_assets=True)
    recipe = _local_recipe(tmp_path)
    result = stack.run_trial(recipe, steps=5, seed=3, workdir=tmp_path / "trial")
    assert result.status == TrialStatus.OK and result.stack == "torchtitan" and not result.simulated
    assert result.tokens_per_sec_per_gpu == 1005.0  # median of steps 3..7 (1003..1007), warm-up skipped
    assert result.mfu == pytest.approx(0.1248) and result.peak_memory_gib == 20.5
    assert result.gpu_hours == pytest.approx(1 * result.wall_time_s / 3600)
    assert result.step_time_s == pytest.approx(8 * 2048 / 1005.0)
    argv = seen["launch"].argv
    assert argv[argv.index("--training.steps") + 1] == "7" and argv[argv.index("--debug.seed") + 1] == "3"
    assert argv[argv.index("--lr_scheduler.total_steps") + 1] == "10"  # the recipe's own length
    assert "--checkpoint.no-enable" in argv and "--metrics.log_freq" in argv
    assert (tmp_path / "trial" / "assets" / "tokenizer" / "tokenizer.json").is_file()
    assert seen["launch"].env["HF_HUB_OFFLINE"] == "1"
    # measured figures now drive the estimate (x1.25): start-up (here 0: the fake's "steps" are
    # slower than its wall time) and the step time of this launch, instead of the 120 s prior
    assert TorchtitanStack().estimate_wall_time_s(recipe, 5) > 120
    assert stack.estimate_wall_time_s(recipe, 5) == pytest.approx(1.25 * 7 * result.step_time_s)


def test_stack_reports_refused_launches_without_charging(tmp_path):
    stack = TorchtitanStack(executor=lambda *a: pytest.fail("must not run"), validate=False)
    recipe = _local_recipe(tmp_path)
    bad = recipe.with_config(dict(recipe.config) | {"quantize.float8": "tensorwise"})
    result = stack.run_trial(bad, steps=5, seed=0, workdir=tmp_path / "t")
    assert result.status == TrialStatus.CRASH and result.wall_time_s == 0 and "tensorwise" in result.message


def test_estimate_is_conservative_for_a_large_recipe():
    recipe = load_recipe(REPO / "recipes/public/llama3_405b.toml")
    estimate = TorchtitanStack().estimate_wall_time_s(recipe, 20)
    # compile + init + 23 steps of 405B at 15% MFU: well over ten minutes
    assert estimate > 600


def test_local_executor_refuses_multi_node(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_RDZV_ENDPOINT", "head:29500")
    result = TorchtitanStack(validate=False).run_trial(load_recipe(REPO / "recipes/public/llama3_405b.toml"), 5, 0,
                                                      tmp_path)
    assert result.status == TrialStatus.CRASH and "work pool" in result.message
