"""ProxyConfig: what one proxy run reproduces of a recipe, and how a recipe maps onto it.

The proxy keeps the recipe's structure (DP ranks, local batch, accumulation, pipeline
micro-batches, TP/CP/EP degrees, recomputation, float8, reduction dtype, MoE capacity and
router dtype) and replaces the model by a tiny decoder and the optimizer settings by one
shared probe schedule. Objective fields are equal between baseline and candidate by the time
the proxy runs (the config check comes first), so both are trained under the same probe
optimizer: a short warmup to a constant peak LR, as the gate study recommends (a 200-step
production warmup would keep a 40-step probe at a few percent of the peak LR and hide
update-path faults). A constant LR after warmup also makes a longer run an extension of a
shorter one, which the sequential check relies on.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from attune.errors import InputError
from attune.proxy.faults import fault_names
from attune.recipe import Recipe

MAX_SAMPLES = 32      # proxy global batch cap (samples); larger recipes are scaled down
MAX_RANKS = 8         # DP ranks played (each is a forward/backward per micro-step)
MAX_STEPS = 400       # the train split holds enough documents for this many steps at any DP degree


class ProxyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(default=40, ge=1, le=MAX_STEPS)
    seed: int = 0                 # init seed: a shared seed checkpoint for every run of a comparison
    noise_seed: int = 0           # run-to-run nondeterminism; baseline replicates differ only here
    nondeterminism: float = Field(default=1e-4, ge=0)  # relative gradient jitter per reduction
    dp: int = Field(default=8, ge=1)
    dp_replicate: int = Field(default=1, ge=1)
    local_batch: int = Field(default=4, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    pp_microbatches: int = Field(default=1, ge=1)   # pipeline micro-batches per local batch
    tp: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    seq_len: int = Field(default=64, ge=8)
    data_dp: int | None = None    # read the data as a run with this DP degree would
    lr: float = 3e-3
    warmup: int = 5
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    max_norm: float = 1.0
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    ac_mode: Literal["none", "selective", "full"] = "selective"
    compile: bool = False
    float8: Literal["none", "tensorwise", "rowwise"] = "none"
    moe: bool = True
    capacity_factor: float | None = None
    router_dtype: Literal["float32", "bfloat16"] = "float32"
    load_balance_coeff: float = 1e-3
    faults: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> "ProxyConfig":
        unknown = sorted(set(self.faults) - set(fault_names()))
        if unknown:
            raise ValueError(f"unknown fault(s) {', '.join(unknown)}")
        if self.dp % self.dp_replicate:
            raise ValueError("dp_replicate must divide dp")
        if self.local_batch % self.pp_microbatches:
            raise ValueError("pp_microbatches must divide local_batch")
        if self.seq_len % self.cp:
            raise ValueError("cp must divide seq_len")
        if self.data_dp is not None and self.global_batch % self.data_dp:
            raise ValueError("data_dp must divide the global batch")
        return self

    @property
    def global_batch(self) -> int:
        return self.dp * self.local_batch * self.grad_accum

    @property
    def data_order(self) -> int:
        """The DP degree whose sharding decides which samples form each global batch."""
        return self.data_dp or self.dp


def _scaled(dp: int, local: int, accum: int, gpus: int) -> tuple[int, int, int]:
    """Shrink (dp, local, accum) for the CPU, keeping a baseline's and a candidate's relation.

    1. DP ranks cost a forward/backward each: a factor common to every recipe of the cluster
       (gcd of dp and gpus / MAX_RANKS) moves from the DP degree into the local batch, so the
       global batch, the accumulation and the relation between two layouts' DP degrees (and so
       their data orders) hold while at most MAX_RANKS ranks are played.
    2. Then the global batch is halved, always on its largest factor (local before accumulation
       before dp on ties: the DP degree decides the data order), until it holds at most MAX_SAMPLES. Two recipes with the
       same global batch are halved the same number of times; halving the largest factor keeps
       e.g. "half the micro-batch, twice the accumulation" visible unless the batch is tiny.
    """
    shift = math.gcd(dp, max(1, gpus // MAX_RANKS))
    dp, local = dp // shift, local * shift
    while dp * local * accum > MAX_SAMPLES:
        parts = [dp, local, accum]
        options = [i for i, v in enumerate(parts) if v > 1 and v % 2 == 0]
        if not options:
            break
        i = max(options, key=lambda j: (parts[j], (0, 2, 1)[j]))  # ties: local, then accum, then dp
        parts[i] //= 2
        dp, local, accum = parts
    return dp, local, accum


def proxy_seq_len(seq_len: int) -> int:
    """8192 recipe tokens -> 64 proxy tokens; the proportion is kept within 16..128."""
    return min(128, max(16, seq_len // 128))


def proxy_config(recipe: Recipe, steps: int = 40, seed: int = 0, noise_seed: int = 0,
                 **overrides) -> ProxyConfig:
    """The proxy run that reproduces `recipe`'s numerics-relevant parts."""
    layout = recipe.layout()
    cfg = recipe.config
    dp, local, accum = _scaled(layout.dp, layout.local_batch, layout.grad_accum, recipe.cluster.gpus)
    replicate = layout.dp_replicate if dp % layout.dp_replicate == 0 else 1
    pp_micro = layout.n_microbatches if layout.pp > 1 else 1
    while local % pp_micro:
        pp_micro //= 2
    seq = proxy_seq_len(layout.seq_len)
    cp = layout.cp if seq % layout.cp == 0 else 1
    capacity = cfg.get("moe.capacity_factor")
    values = dict(
        steps=steps, seed=seed, noise_seed=noise_seed, dp=dp, dp_replicate=replicate, local_batch=local,
        grad_accum=accum, pp=layout.pp, pp_microbatches=max(1, pp_micro), tp=layout.tp, cp=cp,
        ep=min(layout.ep, 4), seq_len=seq, ac_mode=layout.ac_mode, compile=bool(layout.compile),
        float8=layout.float8, moe=recipe.architecture.is_moe,
        reduce_dtype="bfloat16" if str(cfg.get("training.mixed_precision_reduce", "float32")) == "bfloat16"
        else "float32",
        capacity_factor=float(capacity) if isinstance(capacity, (int, float)) and capacity > 0 else None,
        router_dtype="bfloat16" if str(cfg.get("moe.router_dtype", "float32")) == "bfloat16" else "float32",
    )
    values |= overrides
    try:
        return ProxyConfig(**values)
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        raise InputError(f"proxy ({recipe.name})", str(err).splitlines()[-1].strip()) from None
