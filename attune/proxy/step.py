"""One optimizer step of the proxy, every simulated rank played in turn, faults injected by name.

The order of work is a distributed trainer's: each DP rank runs its micro-steps (accumulation x
pipeline micro-batches) into its own gradient buffer; the buffers are reduced (fp32 or bf16,
flat or hierarchical for HSDP); run-to-run nondeterminism is emulated once per reduction; then
clipping on the global norm, AdamW, and the MoE load-balancing bias update from the step's
global token counts (torchtitan's aux-loss-free balancing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attune.proxy.config import ProxyConfig
from attune.proxy.corpus import PAD, VOCAB_SIZE
from attune.proxy.data import split_for_ranks
from attune.proxy.model import MoEStats, Numerics, Shape, TinyDecoder

SKETCH_DIM = 8  # random projections per parameter group: a cheap fingerprint of the full gradient


@dataclass
class StepOut:
    loss: float
    grad_norm: float
    post_clip_norm: float
    lr: float
    group_grad_norms: dict[str, float]
    valid_tokens: int
    expert_load: list[float]
    dropped_tokens: int
    recompute_mismatch: int = 0
    sketch: dict[str, list[float]] = field(default_factory=dict)
    update_norm: float = 0.0
    group_update_norms: dict[str, float] = field(default_factory=dict)


def numerics(cfg: ProxyConfig) -> Numerics:
    return Numerics(tp=cfg.tp, cp=cfg.cp, ep=cfg.ep, float8=cfg.float8, ac_mode=cfg.ac_mode,
                    capacity_factor=cfg.capacity_factor, router_dtype=cfg.router_dtype,
                    compile=cfg.compile, faults=frozenset(cfg.faults))


def lr_at(cfg: ProxyConfig, step: int) -> float:
    """Probe schedule: linear warmup to the peak, then constant (the faults change it here)."""
    faults = set(cfg.faults)
    if "sched_per_micro" in faults:
        step = step * cfg.grad_accum * cfg.pp_microbatches
    lr = cfg.lr if "warmup_dropped" in faults else cfg.lr * min(1.0, step / max(1, cfg.warmup))
    return 2 * lr if "lr_x2" in faults else lr


class Trainer:
    """The model, its optimizer and the little state some faults need (previous weights, frozen state)."""

    def __init__(self, cfg: ProxyConfig):
        self.cfg, self.faults = cfg, set(cfg.faults)
        self.num = numerics(cfg)
        self.model = TinyDecoder(Shape(vocab=VOCAB_SIZE, n_experts=4 if cfg.moe else 0), cfg.seed,
                                 frozenset(cfg.faults))
        self.names = [n for n, _ in self.model.named_parameters()]
        self.params = [p for _, p in self.model.named_parameters()]
        self.groups = [self.model.group_of(n) for n in self.names]
        decay = [p for p in self.params if p.dim() >= 2]
        no_decay = [p for p in self.params if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                      {"params": no_decay, "weight_decay": 0.0}],
                                     lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=False)
        self.layer0 = [i for i, n in enumerate(self.names) if n.startswith("layers.0.")]
        self.prev_layer0: list[torch.Tensor] | None = None
        self.frozen_v: dict[int, torch.Tensor] = {}

    # ---- one step -------------------------------------------------------------------------
    def step(self, samples: torch.Tensor, step: int, noise_step: int | None = None,
             detail: bool = False) -> StepOut:
        cfg = self.cfg
        ranks = split_for_ranks(samples, cfg)
        n_global = sum(int(self._mask(mb).sum()) for mbs in ranks for mb in mbs)
        stats = MoEStats(4)
        swapped = self._swap_in_previous_layer0()
        rank_grads, loss = [], 0.0
        for mbs in ranks:
            n_rank = sum(int(self._mask(mb).sum()) for mb in mbs)
            for k, mb in enumerate(mbs):
                mb_stats = MoEStats(4)
                loss += self._micro_step(mb, n_global, n_rank, len(mbs), mb_stats)
                stats.counts += mb_stats.counts
                stats.dropped += mb_stats.dropped
                stats.recompute_mismatch += mb_stats.recompute_mismatch
                if "moe_bias_per_micro" in self.faults:
                    self._balance(mb_stats.counts)
                if "pp_grad_rescale" in self.faults and cfg.pp_microbatches > 1 \
                        and (k + 1) % cfg.pp_microbatches == 0:
                    for p in self.params:  # the schedule's scale_grads divides the running sum again
                        if p.grad is not None:
                            p.grad.div_(cfg.pp_microbatches)
            rank_grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                               for p in self.params])
            self.model.zero_grad(set_to_none=True)
        if swapped is not None:
            self._restore(swapped)
        grads = self._reduce(rank_grads, step if noise_step is None else noise_step)
        for p, g in zip(self.params, grads):
            p.grad = g
        group_norms = self._group_norms(grads)
        total = math.sqrt(sum(v * v for v in group_norms.values()))
        sketch = self._sketch(grads) if detail else {}
        post = self._clip(grads, total)
        lr = lr_at(cfg, step)
        for g in self.opt.param_groups:
            g["lr"] = lr
        before = [p.detach().clone() for p in self.params] if detail else None
        self._remember_layer0()
        self.opt.step()
        self._stale_state(step)
        self.model.zero_grad(set_to_none=True)
        if "moe_bias_per_micro" not in self.faults:
            self._balance(stats.counts)
        out = StepOut(loss=loss, grad_norm=total, post_clip_norm=post, lr=lr, group_grad_norms=group_norms,
                      valid_tokens=n_global, expert_load=(stats.counts / stats.counts.sum().clamp(min=1)).tolist(),
                      dropped_tokens=int(stats.dropped), recompute_mismatch=stats.recompute_mismatch,
                      sketch=sketch)
        if before is not None:
            deltas = [p.detach() - b for p, b in zip(self.params, before)]
            out.group_update_norms = self._group_norms(deltas)
            out.update_norm = math.sqrt(sum(v * v for v in out.group_update_norms.values()))
        return out

    def eval_loss(self, samples: torch.Tensor) -> float:
        """Plain next-token cross-entropy on the fixed eval batch: independent of the loss code."""
        with torch.no_grad():
            logits = self.model(samples[:, :-1], self.num)
            tgt = samples[:, 1:]
            return float(F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=PAD))

    # ---- pieces ---------------------------------------------------------------------------
    def _targets(self, mb: torch.Tensor) -> torch.Tensor:
        if "label_off_by_one" in self.faults:
            return torch.cat([mb[:, 2:], torch.full((mb.shape[0], 1), PAD)], 1)
        return mb[:, 1:]

    def _mask(self, mb: torch.Tensor) -> torch.Tensor:
        if "loss_mask_includes_pad" in self.faults:
            return torch.ones_like(mb[:, 1:], dtype=torch.bool)
        return self._targets(mb) != PAD

    def _micro_step(self, mb: torch.Tensor, n_global: int, n_rank: int, accum: int, stats: MoEStats) -> float:
        cfg, faults = self.cfg, self.faults
        logits = self.model(mb[:, :-1], self.num, stats)
        mask = self._mask(mb)
        ce = F.cross_entropy(logits.flatten(0, 1), self._targets(mb).flatten(), reduction="none")
        ce_sum = (ce * mask.flatten()).sum()
        logged = float(ce_sum.detach()) / n_global
        if "ga_per_micro_mean" in faults:
            scale = 1.0 / (max(1, int(mask.sum())) * accum * cfg.dp)
            logged = float(ce_sum.detach()) * scale
        elif "dp_per_rank_mean" in faults:
            scale = 1.0 / (n_rank * cfg.dp)
            logged = float(ce_sum.detach()) * scale
        elif "ga_no_div" in faults:
            scale = accum / n_global  # the logged loss stays right: only the gradient is scaled
        else:
            scale = 1.0 / n_global
        (ce_sum * scale).backward()
        if "bf16_grad_accum" in faults:
            for p in self.params:
                if p.grad is not None:
                    p.grad.copy_(p.grad.bfloat16().float())
        return logged

    def _reduce(self, rank_grads: list[list[torch.Tensor]], noise_step: int) -> list[torch.Tensor]:
        cfg = self.cfg
        bf16 = cfg.reduce_dtype == "bfloat16" or "bf16_grad_reduce" in self.faults
        out = []
        for i in range(len(self.params)):
            parts = [rg[i] for rg in rank_grads]
            if bf16:
                acc = parts[0].bfloat16()
                for g in parts[1:]:
                    acc = acc + g.bfloat16()
                acc = acc.float()
            elif cfg.dp_replicate > 1:  # HSDP: reduce-scatter inside a replica, all-reduce across
                size = cfg.dp // cfg.dp_replicate
                acc = sum((sum(parts[j * size + 1:(j + 1) * size], parts[j * size])
                           for j in range(cfg.dp_replicate)), torch.zeros_like(parts[0]))
            else:
                acc = sum(parts[1:], parts[0].clone())
            if "norm_grads_not_reduced" in self.faults and self.groups[i] == "norm":
                acc = parts[0].clone()
            out.append(acc)
        if cfg.nondeterminism > 0:
            gen = torch.Generator().manual_seed(1_000_003 * (cfg.noise_seed + 1) + noise_step)
            for g in out:
                g.add_(torch.randn(g.shape, generator=gen) * (cfg.nondeterminism * g.pow(2).mean().sqrt()))
        if "expert_grads_x2" in self.faults:
            for g, group in zip(out, self.groups):
                if group == "experts":
                    g.mul_(2.0)
        return out

    def _group_norms(self, tensors: list[torch.Tensor]) -> dict[str, float]:
        sq: dict[str, float] = {}
        for t, group in zip(tensors, self.groups):
            sq[group] = sq.get(group, 0.0) + float(t.double().pow(2).sum())
        return {k: math.sqrt(v) for k, v in sq.items()}

    def _sketch(self, grads: list[torch.Tensor]) -> dict[str, list[float]]:
        out: dict[str, torch.Tensor] = {}
        for i, (g, group) in enumerate(zip(grads, self.groups)):
            proj = torch.randn(SKETCH_DIM, g.numel(), generator=torch.Generator().manual_seed(4242 + i),
                               dtype=torch.float64)
            out[group] = out.get(group, torch.zeros(SKETCH_DIM, dtype=torch.float64)) + proj @ g.double().flatten()
        return {k: v.tolist() for k, v in out.items()}

    def _clip(self, grads: list[torch.Tensor], total: float) -> float:
        max_norm = self.cfg.max_norm
        if "no_clip" not in self.faults:
            if "clip_local_shard" in self.faults:  # each of two shards clipped by its own norm
                for shard in (grads[0::2], grads[1::2]):
                    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in shard))
                    for g in shard:
                        g.mul_(min(1.0, max_norm / (norm + 1e-6)))
            else:
                for g in grads:
                    g.mul_(min(1.0, max_norm / (total + 1e-6)))
        return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))

    def _balance(self, counts: torch.Tensor) -> None:
        coeff = self.cfg.load_balance_coeff * (-1.0 if "moe_bias_sign_flipped" in self.faults else 1.0)
        for layer in self.model.layers:
            if layer.moe and counts.sum() > 0:
                layer.expert_bias.add_(coeff * torch.sign(counts.mean() - counts))

    def _remember_layer0(self) -> None:
        if "stale_params_layer0" in self.faults:
            self.prev_layer0 = [self.params[i].detach().clone() for i in self.layer0]

    def _swap_in_previous_layer0(self) -> list[torch.Tensor] | None:
        if self.prev_layer0 is None:
            return None
        current = [self.params[i].detach().clone() for i in self.layer0]
        for i, old in zip(self.layer0, self.prev_layer0):
            self.params[i].data.copy_(old)
        return current

    def _restore(self, current: list[torch.Tensor]) -> None:
        for i, cur in zip(self.layer0, current):
            self.params[i].data.copy_(cur)

    def _stale_state(self, step: int) -> None:
        if "opt_shard_stale" not in self.faults:
            return
        for i in range(1, len(self.params), 2):  # the odd shard's second moment never moves after step 1
            state = self.opt.state[self.params[i]]
            if step == 1:
                self.frozen_v[i] = state["exp_avg_sq"].clone()
            elif i in self.frozen_v:
                state["exp_avg_sq"].copy_(self.frozen_v[i])
