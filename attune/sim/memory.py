"""Peak device memory per GPU, vectorised over layouts: FSDP2 mixed precision (torchtitan) or
Megatron's distributed optimizer (the stack's memory table says which).

  parameters  fp32 master shard (4 B/param) + bf16 unsharded working copy: a couple of prefetched
              layers without PP; the whole stage with PP (torchtitan keeps it gathered, no reshard).
              Distributed optimizer: the bf16 copy of every local parameter + the fp32 master shard
  gradients   fp32 shard (4 B/param) + unsharded transients (the whole stage in bf16 with PP, where
              reduce-scatter waits for the last micro-batch). Distributed optimizer: the unsharded
              gradient buffer (grad_bytes a parameter)
  optimizer   Adam moments, fp32 (8 B/param), sharded
  activations saved per layer and token (none / selective / full recomputation), times the
              micro-batches in flight on the first pipeline stage (1F1B: pp; GPipe: all;
              interleaved: a little more), plus one layer's working set and the logits; where the
              stack counts the embedding as a layer of the pipeline split (Megatron), the first
              stage's first chunk holds one decoder layer fewer
  other       CUDA context, NCCL, workspaces, float8 buffers, and allocator fragmentation

A layout fits when live memory plus real fragmentation fits; the reported peak is reserved memory.
"""

from __future__ import annotations

import numpy as np

from attune.sim.arrays import INTERLEAVED_CODES, SCHEDULES, LayoutArrays
from attune.sim.effects import NEUTRAL, Effects
from attune.sim.params import MemoryParams, StackEfficiency
from attune.sim.shapes import Shapes
from attune.spec import ModelSpec

GIB = float(2**30)
GPIPE = SCHEDULES.index("GPipe")


def _per_token_layer(model: ModelSpec, p: MemoryParams, imbalance: np.ndarray) -> tuple[float, np.ndarray]:
    """Saved activation elements per token for one dense and one MoE layer (no recomputation)."""
    attn = p.act_d * model.dim + p.act_q * model.n_heads * model.head_dim + p.act_kv * model.n_kv_heads * model.head_dim
    dense = attn + p.act_ffn * model.ffn_dim
    if not model.is_moe:
        return dense, np.zeros_like(imbalance)
    routed = model.top_k * imbalance
    moe = (attn + p.act_moe_routed * model.dim * routed
           + p.act_ffn * model.moe_ffn_dim * (routed + model.n_shared_experts) + 2.0 * model.n_experts)
    return dense, moe


def _first_chunk_relief(model: ModelSpec, la: LayoutArrays, sh: Shapes, pipeline_slots: int = 2) -> np.ndarray:
    """Layer-micro-batches the first stage does NOT hold when the pipeline split counts the embedding
    as a layer (Megatron's account_for_embedding/loss_in_pipeline_split, which Megatron-Bridge sets
    for its large MoE recipes, where L + 2 divides into the pipeline's chunks). The split gives each
    of the pp·v chunks (L + 2) / (pp·v) slots and the embedding one slot of the first chunk, so the
    first stage holds (L + 2) / pp - 1 decoder layers; the busiest-stage count (shapes.layers,
    ceil(L / (pp·v))·v) is one more than that, except with pp·v = 2, where ceil(L / 2) already is
    (L + 2) / 2 - 1. That layer is missing from the first chunk: each micro-batch in flight there
    saves one layer less. Megatron runs pp micro-batches per chunk in turn, so during the warm-up of an
    interleaved schedule the first chunk sees 2·pp - 1 of them, with 1F1B pp, with GPipe all."""
    interleaved = INTERLEAVED_CODES[la.sched] & (sh.v > 1)
    on_first_chunk = np.where(la.sched == GPIPE, sh.m,
                              np.minimum(sh.m, np.where(interleaved, 2.0 * sh.pp - 1.0, sh.pp)))
    slots = model.n_layers + pipeline_slots
    splits = np.mod(slots, sh.pp * sh.v) == 0   # Megatron refuses the flags otherwise
    first_stage = slots / sh.pp - 1.0
    return np.where(sh.piped & splits, (sh.layers - first_stage) * on_first_chunk, 0.0)


def peak_memory(model: ModelSpec, la: LayoutArrays, sh: Shapes, p: MemoryParams, eff: StackEfficiency,
                fx: Effects = NEUTRAL) -> dict[str, np.ndarray]:
    """GiB per part on the busiest GPU. `total_gib` is what a memory report shows (reserved, the
    parts sum to it); `required_gib` is what must fit in the device for the run to succeed."""
    tp, M, L = sh.tp, sh.tokens, sh.layers
    full = la.ac == 2
    dense_el, moe_el = _per_token_layer(model, p, sh.imbalance)
    layer_bytes = 2.0 * ((1 - sh.moe_frac) * dense_el + sh.moe_frac * moe_el) / tp   # SP splits by tp
    keep = np.where(full, 2.0 * model.dim / tp / np.maximum(layer_bytes, 1e-9),
                    np.where(la.ac == 1, p.sac_keep, 1.0))
    scale = np.where(la.comp, p.compile_act, 1.0) * np.where(la.f8 > 0, p.fp8_act, 1.0) * fx.activation_memory

    extra = np.array([eff.inflight.get(s, 0.0) for s in SCHEDULES])[la.sched]
    inflight_first = np.where(la.sched == GPIPE, sh.m, np.minimum(sh.m, sh.pp + extra * (sh.pp - 1) / sh.v))
    inflight_first = np.where(sh.piped, inflight_first, 1.0)
    inflight_last = np.where(sh.piped & (la.sched == GPIPE), sh.m, 1.0)
    saved = L * M * layer_bytes * keep * scale
    if p.embedding_in_pipeline_split:
        saved_first = saved * inflight_first - _first_chunk_relief(model, la, sh, p.pipeline_slots) * M * layer_bytes * keep * scale
    else:
        saved_first = saved * inflight_first
    working = M * layer_bytes * scale                       # one layer in backward / being recomputed
    working = working + np.where(tp > 1, p.tp_gathered * M * model.dim * 2.0, 0.0)  # SP gathers are not /tp
    logits = M * model.vocab_size / tp * p.logits_bytes

    shard = sh.sharded_params
    unsharded = sh.dense_local + sh.expert_local
    per_layer_unsharded = unsharded / (L + 2.0)
    if p.distributed_optimizer:   # Megatron: only the optimizer step's state is split over DP
        params = 2.0 * unsharded + 4.0 * shard
        grads = p.grad_bytes * unsharded
    else:
        params = 4.0 * shard + np.where(sh.piped, 2.0 * unsharded, 2.0 * p.prefetch_layers * per_layer_unsharded
                                        + 2.0 * model.vocab_size * model.dim / tp)
        grads = 4.0 * shard + np.where(sh.piped, 2.0 * unsharded, 4.0 * p.prefetch_layers * per_layer_unsharded)
    optim = 8.0 * shard
    act_first = saved_first + working + np.where(sh.piped, 0.0, logits)
    act_last = saved * inflight_last + working + logits
    acts = np.maximum(act_first, act_last)
    live = params + grads + optim + acts
    fixed = (p.fixed_gib + p.fp8_fixed_gib * (la.f8 > 0)) * GIB
    # Fragmentation that really blocks an allocation (the caching allocator frees its cache and
    # retries before it fails); what torchtitan reports is reserved memory, a little more again.
    frag = fx.fragmentation + fx.fragmentation_per_inflight * inflight_first
    other = fixed + (p.fragmentation + frag) * live
    out = {"params": params / GIB, "grads": grads / GIB, "optimizer": optim / GIB, "activations": acts / GIB,
           "other": other / GIB}
    out["total_gib"] = (live + other) / GIB
    out["required_gib"] = (live * (1.0 + frag) + fixed) / GIB
    return out
