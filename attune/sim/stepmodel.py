"""One optimizer step of many layouts: time parts, memory parts, throughput, MFU, fits.

The estimator calls it with the neutral effects, the ground truth with a cluster's hidden ones;
the physics is the same. Results are columns; `SimResult` turns one of them into what a trial or
the CLI reports.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from attune.sim.arrays import LayoutArrays
from attune.sim.effects import NEUTRAL, Effects
from attune.sim.hardware import Hardware
from attune.sim.memory import peak_memory
from attune.sim.params import memory_params, stack_efficiency
from attune.sim.physics import step_time
from attune.sim.shapes import shapes, torchtitan_flops_per_token
from attune.spec import ModelSpec

COMM_KEYS = ("fsdp", "tp", "pp", "ep", "cp", "dp_replicate")
TIME_KEYS = ("compute_s", "recompute_s", "bubble_s", "optimizer_s", "other_s")
MEMORY_KEYS = ("params", "grads", "optimizer", "activations", "other")


def evaluate(model: ModelSpec, hw: Hardware, la: LayoutArrays, stack: str = "torchtitan",
             fx: Effects = NEUTRAL, eff=None, mem=None) -> dict[str, np.ndarray]:
    """Columns: every time part (s/step), every memory part (GiB), step_s, tps, mfu, total_gib, fits."""
    eff = eff or stack_efficiency(stack)
    mem = mem or memory_params(stack)
    if hw.runtime_gib is not None:   # no CUDA context to hold: the process's own base memory instead
        mem = mem.model_copy(update={"fixed_gib": hw.runtime_gib})
    sh = shapes(model, la, eff.moe_imbalance)
    out = step_time(model, hw, la, sh, eff, fx)
    memory = peak_memory(model, la, sh, mem, eff, fx)
    # Reserved memory never exceeds the device: the allocator releases its cache first. A layout
    # that does not fit reports what it needed.
    shown = np.where(memory["required_gib"] > hw.hbm_gib, memory["required_gib"],
                     np.minimum(memory["total_gib"], hw.hbm_gib))
    memory["other"] = memory["other"] + (shown - memory["total_gib"])
    memory["total_gib"] = shown
    out.update({f"mem_{k}": v for k, v in memory.items()})
    tokens_per_gpu = np.asarray(la.gbs, float) * np.asarray(la.seq, float) / sh.world
    out["tps"] = tokens_per_gpu / out["step_s"]
    out["mfu"] = out["tps"] * torchtitan_flops_per_token(model, la.seq) / hw.peak_bf16
    out["fits"] = memory["required_gib"] <= hw.hbm_gib
    return out


def fits_mask(model: ModelSpec, hw: Hardware, la: LayoutArrays, stack: str = "torchtitan",
              fx: Effects = NEUTRAL) -> np.ndarray:
    """Which layouts fit in device memory: the memory model alone, a fraction of evaluate's cost."""
    eff, mem = stack_efficiency(stack), memory_params(stack)
    sh = shapes(model, la, eff.moe_imbalance)
    return peak_memory(model, la, sh, mem, eff, fx)["required_gib"] <= hw.hbm_gib


class SimResult(BaseModel):
    """One layout's simulated step, as the CLI and the sim stack report it."""

    model_config = ConfigDict(extra="forbid")

    fits: bool
    peak_memory_gib: float
    step_time_s: float
    tokens_per_sec_per_gpu: float
    mfu: float
    breakdown: dict[str, Any]
    simulated: bool = True
    source: str


def result_at(cols: dict[str, np.ndarray], i: int, hw: Hardware, source: str) -> SimResult:
    """Row i as a SimResult; the breakdown follows attune.stacks.base.TrialResult's format."""
    r = lambda key: round(float(cols[key][i]), 6)  # noqa: E731
    breakdown = {k: r(k) for k in TIME_KEYS}
    breakdown["exposed_comm_s"] = {k: r(f"{k}_s") for k in COMM_KEYS}
    breakdown["comm_total_s"] = {k: r(f"{k}_total_s") for k in COMM_KEYS}
    breakdown["memory_gib"] = {k: round(float(cols[f"mem_{k}"][i]), 3) for k in MEMORY_KEYS}
    breakdown["hbm_gib"] = hw.capacity_gib
    return SimResult(fits=bool(cols["fits"][i]), peak_memory_gib=round(float(cols["mem_total_gib"][i]), 3),
                     step_time_s=r("step_s"), tokens_per_sec_per_gpu=round(float(cols["tps"][i]), 3),
                     mfu=round(float(cols["mfu"][i]), 5), breakdown=breakdown, source=source)
