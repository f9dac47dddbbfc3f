"""The step model's efficiency parameters, read from attune/data/sim_efficiency.toml.

A stack's parameters are torchtitan's with the stack's own table laid over them, so a stack that
differs in a few kernels (Megatron-Core's fused kernels, overlapped TP) lists only those.
"""

from __future__ import annotations

import functools

from pydantic import BaseModel, ConfigDict

from attune.data_files import load_data
from attune.errors import InputError


class StackEfficiency(BaseModel):
    """Rates and fractions of one software stack; field comments live in the TOML file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_bf16: float
    gemm_fp8: float
    fp8_rowwise: float
    grouped_gemm: float
    gemm_m0: float
    gemm_n0: float
    grouped_m0: float
    fp8_experts: bool
    attn: dict[str, float]
    attn_s0: float
    attn_hd64: float
    attn_bwd_ratio: float
    cp_overhead: float
    hbm_eff: float
    ew_bytes_d: float
    ew_bytes_ffn: float
    ew_bytes_moe: float
    tp_bytes_d: float
    fp8_cast_bytes: float
    loss_bytes: float
    compile_ew: float
    compile_cast: float
    compile_moe: float
    launch_us_layer: float
    launch_us_moe: float
    compile_launch: float
    optimizer_bytes: float
    sac_recompute: float
    nvlink_eff: float
    network_eff: float
    a2a_nvlink_eff: float
    a2a_network_eff: float
    latency_nvlink_us: float
    latency_network_us: float
    reduce_bytes: float
    tp_exposed: float
    tp_exposed_compiled: float
    tp_exposed_async: float
    ep_exposed: float
    pp_exposed: float
    fsdp_overlap: float
    cp_overlap: float
    contention: float
    fsdp_per_microstep: bool
    moe_imbalance: float
    launch_s: float
    launch_s_per_log2_gpus: float
    launch_s_per_100b_params: float
    compile_s: float
    compile_s_per_layer_kind: float
    warmup_steps: float
    warmup_s: float
    bubble: dict[str, float]
    inflight: dict[str, float]


class MemoryParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    act_d: float
    act_q: float
    act_kv: float
    act_ffn: float
    act_moe_routed: float
    sac_keep: float
    compile_act: float
    fp8_act: float
    logits_bytes: float
    fixed_gib: float
    fp8_fixed_gib: float
    fragmentation: float
    prefetch_layers: float
    tp_gathered: float
    # False: FSDP2 (parameters, gradients and optimizer state sharded over the DP shard group).
    # True: Megatron's distributed optimizer (bf16 parameters and the gradient buffer unsharded
    # over DP, fp32 master weights and Adam moments sharded: 2 + grad_bytes + 12/dp bytes a parameter).
    distributed_optimizer: bool = False
    grad_bytes: float = 4.0
    # True: the pipeline split counts the embedding and the loss as a layer each (Megatron's
    # account_for_*_in_pipeline_split), so the first stage's first chunk has one decoder layer fewer.
    embedding_in_pipeline_split: bool = False
    # The pipeline slots that are no decoder layer: the embedding and the loss, and a multi-token-
    # prediction block where a custom Megatron layout places one (DeepSeek-V3's "Et|(tt|)*30mL").
    pipeline_slots: int = 2


class HardwareParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    power_exponent: float
    reserved_gib: float
    runtime_gib: dict[str, float] = {}    # parts without a CUDA driver: the process's own base memory
    gemm_scale: dict[str, float] = {}
    variants: dict[str, dict[str, float]] = {}


def _table() -> dict:
    return load_data("sim_efficiency")


@functools.cache
def stack_efficiency(stack: str = "torchtitan") -> StackEfficiency:
    stacks = _table()["stacks"]
    if stack not in stacks:
        raise InputError("stack", f"the simulator has no efficiency table for {stack!r}; known: {', '.join(stacks)}")
    merged = dict(stacks["torchtitan"])
    for key, value in stacks[stack].items():
        merged[key] = dict(merged[key]) | value if isinstance(value, dict) else value
    return StackEfficiency(**merged)


@functools.cache
def memory_params(stack: str = "torchtitan") -> MemoryParams:
    """torchtitan's memory parameters with the stack's own [memory_stacks.<stack>] laid over them."""
    table = _table()
    return MemoryParams(**(table["memory"] | table.get("memory_stacks", {}).get(stack, {})))


@functools.cache
def hardware_params() -> HardwareParams:
    return HardwareParams(**_table()["hardware"])
