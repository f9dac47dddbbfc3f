"""The figures of one cluster the step model needs, resolved from a ClusterSpec.

Calibration points run on parts the accelerator table does not name (H100 96 GB at a 500 W
limit): `hardware(cluster, power_w=..., hbm_gib=...)` takes those, and a part variant's HBM
bandwidth comes from attune/data/sim_efficiency.toml.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from attune.sim.params import hardware_params
from attune.spec import ClusterSpec


@dataclass(frozen=True)
class Hardware:
    accelerator: str
    gpus: int
    gpus_per_node: int
    peak_bf16: float        # FLOP/s, nominal (what MFU divides by)
    peak_fp8: float
    clock: float            # sustained tensor-core clock relative to the part at its TDP
    gemm_scale: float       # GEMM kernel maturity on this part
    hbm_gib: float          # usable device memory for the job
    capacity_gib: float     # nominal device memory (what a memory report calls the total)
    hbm_bps: float          # bytes/s
    nvlink_bps: float       # bytes/s per GPU, one direction
    network_bps: float
    power_w: float
    tdp_w: float
    runtime_gib: float | None = None   # a process's base memory where the part has no CUDA context

    @property
    def supports_float8(self) -> bool:
        return self.peak_fp8 > 0


@functools.lru_cache(maxsize=512)
def hardware(cluster: ClusterSpec, power_w: float | None = None, hbm_gib: float | None = None) -> Hardware:
    part = cluster.part
    params = hardware_params()
    capacity = float(hbm_gib if hbm_gib is not None else cluster.memory_gib)
    variant = params.variants.get(f"{cluster.accelerator}-{capacity:g}", {})
    power = float(power_w if power_w is not None else part.tdp_w)
    clock = min(1.0, (power / part.tdp_w) ** params.power_exponent)
    runtime = params.runtime_gib.get(cluster.accelerator)
    return Hardware(accelerator=cluster.accelerator, gpus=cluster.gpus, gpus_per_node=cluster.node_size,
                    peak_bf16=part.peak_bf16_tflops * 1e12, peak_fp8=part.peak_fp8_tflops * 1e12, clock=clock,
                    gemm_scale=params.gemm_scale.get(cluster.accelerator, 1.0),
                    hbm_gib=capacity - (0.0 if runtime is not None else params.reserved_gib), capacity_gib=capacity,
                    hbm_bps=variant.get("hbm_tbps", part.hbm_tbps) * 1e12,
                    nvlink_bps=cluster.nvlink_gbps * 1e9, network_bps=cluster.network_gbps * 1e9,
                    power_w=power, tdp_w=float(part.tdp_w), runtime_gib=runtime)
