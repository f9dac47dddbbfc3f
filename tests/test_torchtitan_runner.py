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


def _local_recipe(tmp_path, pp: int = 1):
    """A one-GPU llama3 debug-model recipe (the stack refuses multi-node launches locally); pp > 1
    puts it on pp GPUs of one node."""
    spec = tmp_path / "debug.json"
    spec.write_text('{"name": "llama3-debug", "n_layers": 6, "dim": 256, "n_heads": 16, "n_kv_heads": 16, '
                    '"head_dim": 16, "ffn_dim": 768, "vocab_size": 2048}')
    path = tmp_path / "debug.toml"
    path.write_text(textwrap.dedent(f'''
        name = "debug"
        model_spec = "{spec}"
        [cluster]
        accelerator = "h100"
        gpus = {pp}
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
        "parallelism.pipeline_parallel_degree" = {pp}
    '''))
    return load_recipe(path)


def report_layout(layout, log_path: Path, workdir: Path, **ran) -> None:
    """What torchtitan 0.3 writes about the layout it resolved (its log lines and saved config, the
    formats of tests/golden/readback/, a real run's records), for `layout` with `ran` changes."""
    import json
    v = {"pp": layout.pp, "dpr": layout.dp_replicate, "dps": layout.dp_shard, "cp": layout.cp, "tp": layout.tp,
         "ep": layout.ep, "local": layout.local_batch, "glob": layout.global_batch, "accum": layout.grad_accum,
         "seq": layout.seq_len, "ac": {"full": "FullAC", "selective": "SelectiveAC"}.get(layout.ac_mode),
         "schedule": layout.pp_schedule, "mb": layout.pp_microbatch, "compile": layout.compile} | ran
    prefix = "[rank0]:[titan] 2026-12-02 10:00:00,000 - root - INFO - "
    lines = [f"Building device mesh with parallelism: pp={v['pp']}, dp_replicate={v['dpr']}, dp_shard={v['dps']}, "
             f"cp={v['cp']}, tp={v['tp']}, ep={v['ep']}"]
    if v["ac"]:
        lines.append(f"Applied {v['ac']} activation checkpointing to the model")
    if v["pp"] > 1:
        lines.append(f"Using pipeline schedule {v['schedule']} with {v['local'] // v['mb']} microbatches and "
                     f"{v['pp']} stages.")
    lines.append(f"Trainer is initialized with local batch size {v['local']}, global batch size {v['glob']}, "
                 f"gradient accumulation steps {v['accum']}, sequence length {v['seq']}, total steps 7 (warmup 2)")
    with log_path.open("a") as log:
        log.write("".join(prefix + line + "\n" for line in lines))
    config = {"parallelism": {"pipeline_parallel_schedule": v["schedule"], "pipeline_parallel_microbatch_size": v["mb"]},
              "training": {"local_batch_size": v["local"]}, "compile": {"enable": v["compile"]}}
    (workdir / "outputs").mkdir(parents=True, exist_ok=True)
    (workdir / "outputs" / "config.json").write_text(json.dumps(config))


def test_stack_runs_a_trial_and_charges_gpus_times_wall_time(fake, tmp_path):
    seen = {}

    def executor(launch, log_path, limits, workdir):
        seen["launch"] = launch
        outcome = run_process([sys.executable, str(fake), "ok", "0.01"], launch.env, log_path, limits)
        report_layout(recipe.layout(), log_path, workdir)
        return outcome

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
    # the stack's estimate is a prior that no run moves: the campaign learns from runs
    # (attune.campaign.costs), so it can tell how far the prior was off
    assert stack.estimate_wall_time_s(recipe, 5) == pytest.approx(
        TorchtitanStack(warmup_steps=2).estimate_wall_time_s(recipe, 5))
    assert argv[argv.index("--debug.save_config_file") + 1] == "config.json"   # read back after the run
    # torchrun's per-rank logs stay in the trial's folder: nothing left under /tmp
    assert argv[argv.index("--log-dir") + 1] == str((tmp_path / "trial" / "torchelastic").resolve())
    assert argv.index("--log-dir") < argv.index("-m")


def test_a_trial_whose_run_trained_another_layout_is_refused_naming_both(fake, tmp_path):
    """The bug this guards against: the run trains a layout other than the trial's (a schedule
    left to torchtitan's recipe default), and the trial would have recorded the one it asked for."""
    def executor(launch, log_path, limits, workdir):
        outcome = run_process([sys.executable, str(fake), "ok", "0.01"], launch.env, log_path, limits)
        report_layout(recipe.layout(), log_path, workdir, schedule="Interleaved1F1B")
        return outcome

    stack = TorchtitanStack(executor=executor, warmup_steps=2, validate=False, smoke_assets=True)
    recipe = _local_recipe(tmp_path, pp=2)
    result = stack.run_trial(recipe, steps=5, seed=0, workdir=tmp_path / "trial")
    assert result.status == TrialStatus.LAYOUT_MISMATCH and not result.ok
    assert "parallelism.pipeline_parallel_schedule ran 'Interleaved1F1B', requested '1F1B'" in result.message
    assert result.tokens_per_sec_per_gpu is None and result.wall_time_s > 0   # nothing measured; the time was spent
    # a run whose records give no layout at all is refused too: never recorded unread
    bare = TorchtitanStack(executor=lambda launch, log_path, limits, workdir: run_process(
        [sys.executable, str(fake), "ok", "0.01"], launch.env, log_path, limits), warmup_steps=2, validate=False,
        smoke_assets=True).run_trial(recipe, steps=5, seed=0, workdir=tmp_path / "bare")
    assert bare.status == TrialStatus.LAYOUT_MISMATCH and "could not be read back" in bare.message


def test_the_records_of_a_real_run_that_trained_another_schedule_name_both():
    """A real torchtitan 0.3 run (2 CPU processes, before the renderer passed every lever): a PP=2
    trial recorded 1F1B while torchtitan ran its recipe's Interleaved1F1B. Its saved config and log
    (tests/golden/readback/, trimmed) read back as what ran; the trial's request is refused."""
    from attune.stacks.torchtitan import readback
    recipe = load_recipe(REPO / "recipes/cpu/llama3_debug.toml")
    asked = recipe.with_config(dict(recipe.config) | {"parallelism.pipeline_parallel_degree": 2}).layout()
    golden = REPO / "tests/golden/readback"
    config, log = golden / "pp2-interleaved-ran.config.json", golden / "pp2-interleaved-ran.log"
    seen = readback.ran(config, log)
    assert seen["parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B" and seen["pipeline micro-batches"] == 2
    assert seen["parallelism.data_parallel_shard_degree"] == 1 and seen["activation_checkpoint.mode"] == "full"
    assert readback.mismatches(asked, seen) == [
        "parallelism.pipeline_parallel_schedule ran 'Interleaved1F1B', requested '1F1B'"]
    ran = recipe.with_config(dict(recipe.config) | {"parallelism.pipeline_parallel_degree": 2,
                                                    "parallelism.pipeline_parallel_schedule": "Interleaved1F1B"})
    assert readback.check(ran.layout(), config, log) is None


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


def test_a_run_that_ended_early_is_held_to_what_it_resolved(tmp_path):
    """An out-of-memory run says what it ran as far as it got: the mesh, not the trainer's batch
    line. It keeps its own status when that much matches, and is a mismatch when it does not."""
    from attune.stacks.torchtitan import readback
    recipe = load_recipe(REPO / "recipes/cpu/llama3_debug.toml")
    log = tmp_path / "train.log"
    log.write_text("[rank0]:[titan] 2026-12-07 10:00:00,000 - root - INFO - Building device mesh with parallelism: "
                   "pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=1, ep=1\n")
    assert readback.check(recipe.layout(), None, log, complete=False) is None
    assert "not read back" in readback.check(recipe.layout(), None, log, complete=True)
    tp2 = recipe.with_config(dict(recipe.config) | {"parallelism.tensor_parallel_degree": 2}).layout()
    assert "parallelism.tensor_parallel_degree ran 1, requested 2" in readback.check(tp2, None, log, complete=False)
    assert readback.check(recipe.layout(), None, tmp_path / "none.log", complete=False) is None   # resolved nothing
