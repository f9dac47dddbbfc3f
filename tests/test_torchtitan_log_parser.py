"""torchtitan 0.3 log lines in their exact format (ANSI colour codes around each field, logger and
torchrun prefixes) and how a log's ending is classified; `attune trial parse-log --json`."""

from __future__ import annotations

import json
import math

import pytest
from conftest import assert_one_line_error

from attune.stacks.base import TrialStatus
from attune.stacks.torchtitan.log_parser import classify, parse_log, parse_metrics_line

# torchtitan/tools/utils.py Color: red, green, orange, turquoise, blue, cyan, magenta, reset
RED, GREEN, ORANGE, TURQ, BLUE, CYAN, MAGENTA, RESET = (
    "\033[31m", "\033[32m", "\033[38;2;180;60;0m", "\033[38;2;54;234;195m", "\033[34m", "\033[36m", "\033[35m",
    "\033[39m")
PREFIX = "[rank0]:[titan] 2026-12-02 10:11:12,345 - root - INFO - "


def line(step, loss="  9.87654", gn=" 1.2345", mem="71.23", pct="89.97", tps="12,345", tflops="456.78", mfu="46.19%"):
    return (f"{PREFIX}{RED}step: {step:2}  {GREEN}loss: {loss}  {ORANGE}grad_norm: {gn}  "
            f"{TURQ}memory: {mem}GiB({pct}%)  {BLUE}tps: {tps}  {CYAN}tflops: {tflops}  {MAGENTA}mfu: {mfu}{RESET}")


def test_metrics_line_with_colour_codes_and_prefixes():
    m = parse_metrics_line(line(1))
    assert (m.step, m.loss, m.grad_norm, m.memory_gib, m.tps, m.tflops) == (1, 9.87654, 1.2345, 71.23, 12345.0, 456.78)
    assert m.mfu == pytest.approx(0.4619)  # a fraction, not percent
    big = parse_metrics_line(line(120, tps="1,234,567", tflops="1,234.50"))
    assert big.step == 120 and big.tps == 1234567.0 and big.tflops == 1234.5


def test_mfu_na_is_none_and_nan_loss_is_kept():
    m = parse_metrics_line(line(3, loss="     nan", mfu="N/A"))
    assert m.mfu is None and math.isnan(m.loss)


def test_lines_that_are_not_step_metrics():
    validate = f"{PREFIX}\033[33mvalidate step:  5  {GREEN}loss:  9.8765  {TURQ}memory: 71.23GiB(89.97%)  {BLUE}tps: 9{RESET}"
    assert parse_metrics_line(validate) is None
    assert parse_metrics_line(f"{PREFIX}Training starts at step 1") is None


def _log(*extra, steps=4):
    return [f"{PREFIX}Training starts at step 1"] + [line(i) for i in range(1, steps + 1)] + list(extra)


@pytest.mark.parametrize("ending,status", [
    (["[rank0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total "
      "capacity of 79.19 GiB"], TrialStatus.OOM),
    ([f"{PREFIX}\033[33m2 CUDA OOM errors thrown.{RESET}"], TrialStatus.OOM),
    (["[rank3]:torch.OutOfMemoryError: CUDA out of memory.",
      "[rank0]:torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp"], TrialStatus.OOM),
    (["[rank0]:[E1202 10:11:12 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out."], TrialStatus.NCCL_ERROR),
    (["[rank0]:torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3366, unhandled system "
      "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.5", "ncclSystemError: System call failed"],
     TrialStatus.NCCL_ERROR),
    (["[attune] stopped: no progress for 601 s (4 steps logged)"], TrialStatus.TIMEOUT),
    (["[attune] stopped: measured steps done (1 after 3 warm-up)"], TrialStatus.OK),
    ([f"{PREFIX}Training completed"], TrialStatus.OK),
    (["[rank0]:Traceback (most recent call last):", "[rank0]:ValueError: bad shape"], TrialStatus.CRASH),
])
def test_endings_from_the_log_alone(ending, status):
    assert parse_log("\n".join(_log(*ending))).status == status


def test_exit_codes_decide_when_the_log_does_not():
    lines = _log("[rank0]:Traceback (most recent call last):", "[rank0]:KeyError: 'x'")
    status, message = classify(lines, 1)
    assert status == TrialStatus.CRASH and "exit code 1" in message and "KeyError" in message
    assert classify(_log(), 0)[0] == TrialStatus.OK
    assert classify([f"{PREFIX}Building llama3 8B"], 0)[0] == TrialStatus.CRASH  # exited 0 but never trained
    assert classify(_log(), -9, stopped="[attune] stopped: wall-time limit 60 s")[0] == TrialStatus.TIMEOUT


def test_duplicate_steps_from_several_nodes_count_once():
    parsed = parse_log("\n".join([line(1), line(1, tps="99"), line(2)]))
    assert [s.step for s in parsed.steps] == [1, 2] and parsed.steps[0].tps == 12345.0


def test_a_pipeline_stage_without_the_loss_never_hides_the_real_loss():
    # pp=2 logs the first and last local rank; the stage without the loss prints -1 per microbatch,
    # and which rank holds the loss depends on the schedule (ZBVZeroBubble: rank 0).
    placeholder = line(1, loss="-4.00000").replace("[rank0]", "[rank1]")
    for lines in ([placeholder, line(1, loss="  8.13990")], [line(1, loss="  8.13990"), placeholder]):
        assert [s.loss for s in parse_log("\n".join(lines)).steps] == [8.1399]
    assert [s.loss for s in parse_log(placeholder).steps] == [-4.0]   # nothing better: kept as logged


def test_cli_parse_log_json(cli, tmp_path):
    log = tmp_path / "train.log"
    log.write_text("\n".join(_log(steps=2) + [line(3, loss="     nan", mfu="N/A"),
                                                "[rank0]:torch.OutOfMemoryError: CUDA out of memory."]) + "\n")
    payload = json.loads(cli("trial", "parse-log", log, "--json", check=True).stdout)
    assert payload["status"] == "oom" and set(payload) == {"status", "steps"}
    assert payload["steps"][0] == {"step": 1, "loss": 9.87654, "grad_norm": 1.2345, "memory_gib": 71.23,
                                   "tps": 12345.0, "tflops": 456.78, "mfu": 0.4619}
    assert payload["steps"][2]["mfu"] is None and payload["steps"][2]["loss"] is None  # JSON has no NaN
    assert_one_line_error(cli("trial", "parse-log", tmp_path / "missing.log", "--json"), "missing.log")
