"""What every stack returns for one trial, and the interface a stack implements.

A trial runs a recipe for a few measured steps and reports what a user would see: throughput,
MFU, memory, a per-step breakdown where the stack has a profiler's view, and how it ended.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from attune.recipe import Recipe


class TrialStatus(str, Enum):
    OK = "ok"
    OOM = "oom"
    NCCL_ERROR = "nccl_error"
    TIMEOUT = "timeout"
    CRASH = "crash"
    # the run trained another layout than the one asked for (attune/stacks/torchtitan/readback.py):
    # never recorded as a measurement of the requested one, and not retried (it would run the same)
    LAYOUT_MISMATCH = "layout_mismatch"


class StepMetrics(BaseModel):
    """One metrics line (torchtitan's fields; mfu as a fraction, None where unknown)."""
    model_config = ConfigDict(extra="forbid")
    step: int
    loss: float | None = None
    grad_norm: float | None = None
    memory_gib: float | None = None
    tps: float | None = None
    tflops: float | None = None
    mfu: float | None = None


class TrialResult(BaseModel):
    """The measured outcome of one trial.

    breakdown (sim stack; torchtitan fills what its logs show), all seconds per optimizer step:
      compute_s, recompute_s, bubble_s, optimizer_s, other_s,
      exposed_comm_s: {fsdp, tp, pp, ep, cp, dp_replicate}  (communication not hidden by compute)
      comm_total_s: the same kinds, their whole time (hidden or not), as a profiler's trace shows it
      memory_gib: {params, grads, optimizer, activations, other}, hbm_gib (device capacity)
    """
    model_config = ConfigDict(extra="forbid")

    status: TrialStatus
    stack: str
    levers: dict[str, Any]
    gpus: int = Field(gt=0)
    wall_time_s: float = Field(ge=0)          # start-up and compile included: what is charged
    tokens_per_sec_per_gpu: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None
    peak_memory_gib: float | None = None
    breakdown: dict[str, Any] = {}
    steps: list[StepMetrics] = []
    simulated: bool = False
    message: str = ""

    @property
    def gpu_hours(self) -> float:  # derived, not stored: a saved result loads back exactly
        return self.gpus * self.wall_time_s / 3600.0

    @property
    def ok(self) -> bool:
        return self.status == TrialStatus.OK


class Stack(Protocol):
    """A place trials run. Implementations: attune.stacks.sim.SimStack, attune.stacks.torchtitan."""

    name: str

    def estimate_wall_time_s(self, recipe: Recipe, steps: int) -> float:
        """A conservative estimate of a trial's wall time before it runs (for the budget check)."""
        ...

    def run_trial(self, recipe: Recipe, steps: int, seed: int, workdir: Path) -> TrialResult:
        """Run `recipe` for `steps` measured steps; never raises for a failed run, reports it."""
        ...
