"""Per-GPU quantities of a layout that both the time model and the memory model use.

Everything is a numpy column over layouts. Conventions (torchtitan's):
  * mesh order [pp, dp_replicate, dp_shard, cp, tp], tp innermost: a group of consecutive ranks
    of size tp·cp·dp_shard shares the FSDP shards; it stays inside a node when it fits there.
  * sequence parallel with TP: norms and residuals see 1/tp of the tokens.
  * EP borrows from dp_shard·cp·tp (expert tensor parallel 1): with ep > 1 each rank holds E/ep
    whole experts; with ep = 1 the experts are TP-sharded like a dense FFN.
  * The busiest pipeline rank holds ceil(L/(pp·v))·v layers plus the output head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attune.sim.arrays import LayoutArrays
from attune.spec import ModelSpec


@dataclass(frozen=True)
class Shapes:
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    dpr: np.ndarray
    dps: np.ndarray
    v: np.ndarray
    seq: np.ndarray
    world: np.ndarray
    ga: np.ndarray            # gradient-accumulation steps
    m: np.ndarray             # pipeline micro-batches per local batch (1 without PP)
    piped: np.ndarray         # bool: pp > 1
    tokens: np.ndarray        # tokens one GPU handles per micro-batch (before the SP split)
    layers: np.ndarray        # layers on the busiest rank
    moe_frac: np.ndarray      # share of those layers that are MoE
    dense_local: np.ndarray   # non-expert parameters one rank holds unsharded (TP-split)
    expert_local: np.ndarray  # expert parameters one rank holds unsharded (EP- or TP-split)
    g_dense: np.ndarray       # FSDP group of the non-expert parameters
    g_expert: np.ndarray      # FSDP group of the expert parameters
    imbalance: np.ndarray     # max/mean routed tokens per rank

    @property
    def sharded_params(self) -> np.ndarray:
        """Parameters one rank owns after FSDP sharding (what the optimizer updates)."""
        return self.dense_local / self.g_dense + self.expert_local / self.g_expert


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def shapes(model: ModelSpec, la: LayoutArrays, moe_imbalance: float) -> Shapes:
    tp, pp, cp, ep = f64(la.tp), f64(la.pp), f64(la.cp), f64(la.ep)
    dpr, dps, v, seq = f64(la.dpr), f64(la.dps), f64(la.v), f64(la.seq)
    lb, gbs, mb = f64(la.lb), f64(la.gbs), f64(la.mb)
    piped = la.pp > 1
    world = dpr * dps * cp * tp * pp
    ga = gbs / (lb * dpr * dps)
    m = np.where(piped, lb / mb, 1.0)
    tokens = np.where(piped, mb, lb) * seq / cp
    L = float(model.n_layers)
    layers = np.minimum(np.ceil(L / (pp * v)) * v, L)
    n_moe = float(model.n_moe_layers)
    if model.is_moe:
        moe_frac = np.where(piped, np.minimum(1.0, n_moe / layers), n_moe / L)
    else:
        moe_frac = np.zeros_like(tp)
    attn = float(model.attention_params_per_layer)
    dense_layer = attn + model.dense_ffn_params
    moe_layer_shared = attn + model.n_shared_experts * model.expert_params + model.dim * model.n_experts
    head = np.where(piped, 1.0, 2.0) * model.vocab_size * model.dim  # output (+ embedding without PP)
    dense_local = (layers * ((1 - moe_frac) * dense_layer + moe_frac * moe_layer_shared) + head) / tp
    expert_split = np.where(ep > 1, ep, tp)
    expert_local = layers * moe_frac * model.n_experts * model.expert_params / expert_split
    g_dense = dps * cp
    g_expert = np.where(ep > 1, np.maximum(1.0, dps * cp * tp / ep), dps * cp)
    imbalance = 1.0 + moe_imbalance * (1.0 - 1.0 / ep) if model.is_moe else np.ones_like(tp)
    return Shapes(tp=tp, pp=pp, cp=cp, ep=ep, dpr=dpr, dps=dps, v=v, seq=seq, world=world, ga=ga, m=m,
                  piped=piped, tokens=tokens, layers=layers, moe_frac=moe_frac, dense_local=dense_local,
                  expert_local=expert_local, g_dense=g_dense, g_expert=g_expert,
                  imbalance=np.broadcast_to(imbalance, tp.shape))


def torchtitan_flops_per_token(model: ModelSpec, seq: np.ndarray) -> np.ndarray:
    """torchtitan's MFU numerator: 6·(active params - input embedding) + 12·L·H·hd·seq."""
    dense = 6.0 * (model.active_params - model.vocab_size * model.dim)
    return dense + 12.0 * model.n_layers * model.n_heads * model.head_dim * f64(seq)
