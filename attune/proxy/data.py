"""Which samples each simulated rank trains on at each step, plus the fixed probe and eval batches.

Data order follows torchtitan's: the train split is cut into one contiguous shard per DP rank
and each rank walks its own shard. The global batch of step t is therefore a function of the
DP degree (`ProxyConfig.data_order`), not of the local batch or accumulation split: a run with
half the micro-batch and twice the accumulation sees exactly the same samples per step.
"""

from __future__ import annotations

import torch

from attune.proxy.config import MAX_SAMPLES, MAX_STEPS, ProxyConfig
from attune.proxy.corpus import TRAIN_DOCS, batch_tensor, documents, rank_shard

N_TRAIN = TRAIN_DOCS
assert N_TRAIN >= MAX_SAMPLES * MAX_STEPS  # every DP degree has a shard long enough for MAX_STEPS
N_EVAL = 32


def _train_docs() -> tuple[str, ...]:
    return documents("train", N_TRAIN)


def global_batch_docs(cfg: ProxyConfig, step: int) -> list[str]:
    """The samples of `step` (1-based) in data-rank order, with the data faults applied."""
    docs, order, faults = _train_docs(), cfg.data_order, set(cfg.faults)
    per_rank = cfg.global_batch // order
    if "data_repeated" in faults:
        step = 1
    if "data_skip" in faults:
        step = 2 * step - 1
    out: list[str] = []
    for rank in range(order):
        shard = rank_shard(len(docs), order, 0 if "data_same_shard" in faults else rank)
        index = range((step - 1) * per_rank, step * per_rank)
        if "data_reordered" in faults:  # the same shard, walked in another order
            index = [(i * 7 + rank) % len(shard) for i in index]
        out += [docs[shard[i]] for i in index]
    return out


def split_for_ranks(samples: torch.Tensor, cfg: ProxyConfig) -> list[list[torch.Tensor]]:
    """[global, seq+1] -> per compute rank, its micro-steps (accumulation x pipeline micro-batches)."""
    per_rank = cfg.local_batch * cfg.grad_accum
    micro = cfg.local_batch // cfg.pp_microbatches
    ranks = []
    for r in range(cfg.dp):
        mine = samples[r * per_rank:(r + 1) * per_rank]
        ranks.append([mine[i:i + micro] for i in range(0, per_rank, micro)])
    return ranks


def step_samples(cfg: ProxyConfig, step: int) -> torch.Tensor:
    return batch_tensor(global_batch_docs(cfg, step), cfg.seq_len)


def probe_samples(cfg: ProxyConfig) -> torch.Tensor:
    """The fixed global batch of the step-1 probe: the same samples whatever the layout."""
    return batch_tensor(documents("probe", cfg.global_batch), cfg.seq_len)


def eval_samples(cfg: ProxyConfig) -> torch.Tensor:
    """The fixed held-out eval batch, scored with plain next-token cross-entropy."""
    return batch_tensor(documents("eval", N_EVAL), cfg.seq_len)
