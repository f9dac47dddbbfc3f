"""Parse a torchtitan 0.3 training log: the per-step metrics line and how the run ended.

The metrics line (torchtitan/components/metrics.py), each field wrapped in ANSI colour codes and
preceded by the logger's prefix (and torchrun's `[rank0]:` with --tee):

    [rank0]:[titan] 2026-12-02 10:00:00,000 - root - INFO - step:  5  loss:  9.87654
        grad_norm:  1.2345  memory: 12.34GiB(15.62%)  tps: 1,234  tflops: 56.78  mfu: 5.74%

memory is the peak reserved memory, tps tokens per second per device, mfu a percentage or `N/A`
(torchtitan prints N/A when quantization makes it ill-defined). Validation lines start with
`validate step:` and carry no grad_norm, so they never match.
"""

from __future__ import annotations

import functools
import math
import re
import statistics
import tomllib
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from attune.stacks.base import StepMetrics, TrialStatus

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUM = r"[-+]?(?:[\d,]*\.?\d+(?:[eE][-+]?\d+)?|nan|inf|-inf)"
METRICS = re.compile(
    r"(?<!validate )step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>" + _NUM + r")\s+"
    r"grad_norm:\s*(?P<grad_norm>" + _NUM + r")\s+"
    r"memory:\s*(?P<memory>" + _NUM + r")GiB\((?P<memory_pct>" + _NUM + r")%\)\s+"
    r"tps:\s*(?P<tps>" + _NUM + r")\s+tflops:\s*(?P<tflops>" + _NUM + r")\s+"
    r"mfu:\s*(?:(?P<mfu>" + _NUM + r")%|N/A)")

# Lines the runner appends when it stops a run itself (runner.py writes them; parse-log reads them).
STOP_MEASURED = "[attune] stopped: measured steps done"
STOP_STALLED = "[attune] stopped: no progress"
STOP_WALL = "[attune] stopped: wall-time limit"
STOP_ASKED = "[attune] stopped: asked to stop"


class ParsedLog(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: TrialStatus
    steps: list[StepMetrics]
    message: str = ""


@functools.cache
def _patterns() -> dict[str, re.Pattern]:
    table = tomllib.loads(Path(__file__).with_name("log_patterns.toml").read_text())
    return {name: re.compile("|".join(f"(?:{p})" for p in spec["patterns"])) for name, spec in table.items()}


def strip_ansi(line: str) -> str:
    return ANSI.sub("", line)


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    return float(text.replace(",", ""))


def parse_metrics_line(line: str) -> StepMetrics | None:
    """The metrics of one torchtitan step line, or None if the line is not one."""
    match = METRICS.search(strip_ansi(line))
    if not match:
        return None
    mfu = _number(match["mfu"])
    return StepMetrics(step=int(match["step"]), loss=_number(match["loss"]), grad_norm=_number(match["grad_norm"]),
                       memory_gib=_number(match["memory"]), tps=_number(match["tps"]),
                       tflops=_number(match["tflops"]), mfu=None if mfu is None else mfu / 100.0)


def error_kind(line: str) -> TrialStatus | None:
    """oom / nccl_error if this line says so, else None."""
    clean = strip_ansi(line)
    patterns = _patterns()
    if patterns["oom"].search(clean):
        return TrialStatus.OOM
    if patterns["nccl_error"].search(clean):
        return TrialStatus.NCCL_ERROR
    return None


def is_completion(line: str) -> bool:
    return bool(_patterns()["completed"].search(strip_ansi(line)))


def is_placeholder_loss(metrics: StepMetrics) -> bool:
    """A pipeline stage without the loss logs -1 per microbatch (torchtitan's
    pp_forward_backward_step); a cross-entropy loss is never negative."""
    return metrics.loss is not None and metrics.loss < 0


def collect_steps(lines: Iterable[str]) -> list[StepMetrics]:
    """Every step once. Several ranks may print a step (one per node, and under pipeline
    parallelism the first and the last local rank): the first line with a real loss wins; a
    placeholder from a stage that holds no loss only when no rank printed one."""
    seen: dict[int, StepMetrics] = {}
    for line in lines:
        metrics = parse_metrics_line(line)
        if metrics is None:
            continue
        if metrics.step not in seen or (is_placeholder_loss(seen[metrics.step]) and not is_placeholder_loss(metrics)):
            seen[metrics.step] = metrics
    return [seen[k] for k in sorted(seen)]


def last_lines(lines: list[str], n: int = 5) -> str:
    tail = [strip_ansi(line).strip() for line in lines if line.strip()][-n:]
    return " | ".join(tail)[-600:]


def classify(lines: list[str], returncode: int | None, *, stopped: str | None = None) -> tuple[TrialStatus, str]:
    """How a run ended, from its log lines, its exit code (None: unknown, as for a log file alone)
    and why the runner stopped it (STOP_* or None). An OOM or NCCL error in the log outranks
    everything else: it is the cause whatever the exit looked like."""
    steps = collect_steps(lines)
    found = {kind: line for line in lines if (kind := error_kind(line)) is not None}
    for kind in (TrialStatus.OOM, TrialStatus.NCCL_ERROR):
        if kind in found:
            return kind, strip_ansi(found[kind]).strip()[-400:]
    stopped = stopped or next((line.strip() for line in reversed(lines) if line.startswith("[attune] stopped")), None)
    if stopped and stopped.startswith((STOP_STALLED, STOP_WALL)):
        return TrialStatus.TIMEOUT, stopped
    if stopped and stopped.startswith(STOP_MEASURED):
        return TrialStatus.OK, f"{len(steps)} steps"
    completed = any(is_completion(line) for line in lines)
    if steps and (returncode == 0 or (returncode is None and completed)):
        return TrialStatus.OK, f"{len(steps)} steps"
    if returncode == 0:
        return TrialStatus.CRASH, "exited 0 without a metrics line: " + last_lines(lines)
    code = "unknown exit" if returncode is None else f"exit code {returncode}"
    return TrialStatus.CRASH, f"{code}: {last_lines(lines)}"


def parse_log(text: str, returncode: int | None = None) -> ParsedLog:
    lines = text.splitlines()
    status, message = classify(lines, returncode)
    return ParsedLog(status=status, steps=collect_steps(lines), message=message)


def measured(steps: list[StepMetrics], warmup_steps: int) -> list[StepMetrics]:
    """The steps that count for throughput: after the first `warmup_steps` (compile, allocator
    warm-up and the first log window make them slow), with a finite tps."""
    return [s for s in steps if s.step > warmup_steps and s.tps is not None and math.isfinite(s.tps)]


def median_or_none(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else None
