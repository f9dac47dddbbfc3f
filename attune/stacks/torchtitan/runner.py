"""Run one training launch as a subprocess: stream its output to a log file, parse every metrics
line as it arrives, stop it once enough steps are measured, and say how it ended.

Stop rules, checked while the run streams:
  measured  `measure_steps` steps after the first `warmup_steps` have been logged -> stopped, ok
  stalled   no new step for `stall_timeout_s` (before the first step: `startup_timeout_s`, which
            covers initialisation and compilation) -> stopped, timeout
  wall      `max_wall_s` passed -> stopped, timeout
The child runs in its own process group so that stopping it also stops torchrun's workers
(SIGTERM, then SIGKILL after `grace_s`). Wall time runs from start to exit, stopping included:
that is what the GPUs were held for.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from attune import interrupt
from attune.stacks.base import StepMetrics, TrialStatus
from attune.stacks.torchtitan.log_parser import (STOP_ASKED, STOP_MEASURED, STOP_STALLED, STOP_WALL, classify,
                                                 is_placeholder_loss, parse_metrics_line)

TAIL_LINES = 200  # kept in memory for classification; the log file has everything


class RunLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    measure_steps: int | None = None      # stop after this many steps past warm-up (None: run to the end)
    warmup_steps: int = 3
    startup_timeout_s: float = 1800.0
    stall_timeout_s: float = 600.0
    max_wall_s: float | None = None
    grace_s: float = 20.0


class RunOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: TrialStatus
    returncode: int | None
    wall_time_s: float
    steps: list[StepMetrics]
    message: str
    log_path: str
    stopped: str | None = None
    allocation: str | None = None        # the scheduler's name for what held the GPUs, e.g. "slurm job 12"
    allocation_s: float | None = None    # how long the scheduler says it held them


def resolve_executable(argv: list[str]) -> list[str]:
    """argv with its program found on PATH or beside this interpreter (a venv's torchrun)."""
    program = argv[0]
    if os.sep in program or shutil.which(program):
        return argv
    beside = Path(sys.executable).with_name(program)
    return [str(beside), *argv[1:]] if beside.exists() else argv


def _reader(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


def run_process(argv: list[str], env: dict[str, str], log_path: Path | str, limits: RunLimits = RunLimits(),
                cwd: Path | str | None = None, on_step: Callable[[StepMetrics], None] | None = None) -> RunOutcome:
    """Run argv (no shell) with env added to this process's environment; never raises for a
    failed run. on_step is called for each new step as its line arrives."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ) | dict(env) | {"PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    try:
        proc = subprocess.Popen(resolve_executable(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=full_env, cwd=cwd, text=True, errors="replace",
                                bufsize=1, start_new_session=True)
    except OSError as err:
        log_path.write_text(f"[attune] could not start {argv[0]}: {err}\n")
        return RunOutcome(status=TrialStatus.CRASH, returncode=None, wall_time_s=0.0, steps=[],
                          message=f"could not start {argv[0]}: {err}", log_path=str(log_path))
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    steps: dict[int, StepMetrics] = {}
    last_progress = started
    stopped: str | None = None
    try:
        with log_path.open("w") as log:
            while True:
                try:
                    line = lines.get(timeout=0.2)
                except queue.Empty:
                    line = ""
                if line is None:  # the child closed its output: it has exited or is exiting
                    break
                now = time.monotonic()
                if line:
                    log.write(line)
                    log.flush()
                    tail.append(line.rstrip("\n"))
                    metrics = parse_metrics_line(line)
                    if metrics is not None and is_placeholder_loss(metrics):
                        last_progress = now   # a pipeline stage without the loss: progress, not a step
                    elif metrics is not None and metrics.step not in steps:
                        steps[metrics.step] = metrics
                        last_progress = now
                        if on_step is not None:
                            on_step(metrics)
                done = sum(1 for s in steps if s > limits.warmup_steps)
                if limits.measure_steps is not None and done >= limits.measure_steps:
                    stopped = f"{STOP_MEASURED} ({done} after {limits.warmup_steps} warm-up)"
                elif now - last_progress > (limits.stall_timeout_s if steps else limits.startup_timeout_s):
                    stopped = f"{STOP_STALLED} for {now - last_progress:.0f} s ({len(steps)} steps logged)"
                elif limits.max_wall_s is not None and now - started > limits.max_wall_s:
                    stopped = f"{STOP_WALL} {limits.max_wall_s:.0f} s"
                elif interrupt.requested():   # Ctrl-C, SIGTERM or a cancel: end the processes, charge what ran
                    stopped = f"{STOP_ASKED} ({interrupt.requested()})"
                if stopped:
                    interrupt.end_process_group(proc, limits.grace_s)
                    break
            returncode = proc.wait()
            if stopped:
                log.write(stopped + "\n")
    except BaseException:  # an exception here (a signal turned into one) must not orphan the trainers
        interrupt.end_process_group(proc, limits.grace_s)
        raise
    wall = time.monotonic() - started
    ordered = [steps[k] for k in sorted(steps)]
    status, message = classify(list(tail), returncode, stopped=stopped)
    return RunOutcome(status=status, returncode=returncode, wall_time_s=wall, steps=ordered, message=message,
                      log_path=str(log_path), stopped=stopped)
