"""Accelerators (public figures from attune/data/accelerators.toml) and the cluster a recipe runs on."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from attune.data_files import load_data, read_toml
from attune.errors import InputError
from attune.validation import first_error

# No training cluster is near a million GPUs: a count above this is a typo (1e9 for 1e3), refused
# at once rather than after a budget estimate for a billion GPUs.
MAX_GPUS = 1 << 20
MAX_GPUS_PER_NODE = 1024

AcceleratorName = Literal["a100", "h100", "h200", "b200", "cpu"]


class Accelerator(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    peak_bf16_tflops: float
    peak_fp8_tflops: float
    hbm_gib: float
    hbm_tbps: float
    nvlink_gbps: float
    network_gbps: float
    tdp_w: int

    @property
    def supports_float8(self) -> bool:
        return self.peak_fp8_tflops > 0


def accelerator(name: str) -> Accelerator:
    table = load_data("accelerators")["accelerators"]
    if name not in table:
        raise InputError("cluster.accelerator", f"unknown accelerator {name!r}; known: {', '.join(sorted(table))}")
    return Accelerator(name=name, **table[name])


def default_price(name: str) -> float:
    """USD per GPU-hour: ATTUNE_PRICES (a TOML file with a [prices] table) overrides the shipped list."""
    prices = dict(load_data("accelerators")["prices"])
    override = os.environ.get("ATTUNE_PRICES")
    if override:
        prices.update(read_toml(override).get("prices", {}))
    return float(prices[name])


class ClusterSpec(BaseModel):
    """GPUs of one accelerator type, gpus_per_node to a node on NVLink, nodes joined by RDMA."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accelerator: AcceleratorName
    # strict: gpus = 64.0 or 1e9 is a float in TOML; taking it as an integer would hide the typo
    gpus: int = Field(gt=0, le=MAX_GPUS, strict=True)
    gpus_per_node: int = Field(default=8, gt=0, le=MAX_GPUS_PER_NODE, strict=True)
    hbm_gib: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    intra_node_gbps: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    inter_node_gbps: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    price_per_gpu_hour: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _whole_nodes(self) -> "ClusterSpec":
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(f"gpus ({self.gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node})")
        return self

    @property
    def part(self) -> Accelerator:
        return accelerator(self.accelerator)

    @property
    def memory_gib(self) -> float:
        return self.hbm_gib if self.hbm_gib is not None else self.part.hbm_gib

    @property
    def nvlink_gbps(self) -> float:
        return self.intra_node_gbps if self.intra_node_gbps is not None else self.part.nvlink_gbps

    @property
    def network_gbps(self) -> float:
        return self.inter_node_gbps if self.inter_node_gbps is not None else self.part.network_gbps

    @property
    def price(self) -> float:
        return self.price_per_gpu_hour if self.price_per_gpu_hour is not None else default_price(self.accelerator)

    @property
    def node_size(self) -> int:
        return min(self.gpus, self.gpus_per_node)

    @property
    def label(self) -> str:
        return f"{self.accelerator}:{self.gpus}"


def parse_cluster_flag(value: str, base: ClusterSpec | None = None) -> ClusterSpec:
    """`--cluster h200:128` (or just `h200`, keeping the GPU count): a new cluster, other fields default."""
    name, _, count = value.partition(":")
    try:
        accelerator(name)
    except InputError as err:  # the flag is what the user typed, so the error names it
        raise InputError("--cluster", err.rule) from None
    if count:
        if not count.isascii() or not count.isdigit() or int(count) <= 0:
            raise InputError("--cluster", f"GPU count must be a positive integer, got {count!r}")
        gpus = int(count)
        if gpus > MAX_GPUS:
            raise InputError("--cluster", f"GPU count must be at most {MAX_GPUS}, got {gpus}")
    elif base is not None:
        gpus = base.gpus
    else:
        raise InputError("--cluster", "expected ACCELERATOR:COUNT, e.g. h100:64")
    per_node = base.gpus_per_node if base is not None else 8
    if gpus > per_node and gpus % per_node:
        raise InputError("--cluster", f"GPU count {gpus} must be a multiple of gpus_per_node ({per_node})")
    try:
        return ClusterSpec(accelerator=name, gpus=gpus, gpus_per_node=per_node)
    except ValidationError as err:
        raise InputError("--cluster", ": ".join(first_error(err))) from None
