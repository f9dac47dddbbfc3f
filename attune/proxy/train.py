"""Run the proxy: the step-1 probe on a fixed batch, then `steps` training steps with a curve row each."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from pydantic import BaseModel, ConfigDict

from attune import interrupt
from attune.proxy.config import ProxyConfig
from attune.proxy.corpus import batch_hash
from attune.proxy.data import eval_samples, probe_samples, step_samples
from attune.proxy.step import Trainer


class CurveRow(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int
    loss: float
    eval_loss: float
    grad_norm: float
    batch_hash: str
    expert_imbalance: float | None = None   # coefficient of variation of tokens per expert (MoE)


class ProxyRun(BaseModel):
    """One run: its curve, its step-1 probe record, what it cost."""
    model_config = ConfigDict(extra="forbid")
    config: ProxyConfig
    rows: list[CurveRow]
    step1: dict
    seconds: float


@contextmanager
def _one_thread():
    # The machines this runs on are shared: one thread per proxy, and every run bitwise repeatable.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def probe(cfg: ProxyConfig) -> dict:
    """Step 1 from the shared initial weights on the fixed probe batch, whatever the data order:
    forward loss, total / per-group gradient norms and a gradient sketch, clipping, LR, update
    norms, and the eval loss after that one update."""
    trainer = Trainer(cfg)
    evals = eval_samples(cfg)
    eval_before = trainer.eval_loss(evals)
    out = trainer.step(probe_samples(cfg), step=1, noise_step=0, detail=True)
    return {"forward_loss": out.loss, "grad_norm": out.grad_norm, "group_grad_norms": out.group_grad_norms,
            "post_clip_norm": out.post_clip_norm, "max_norm": cfg.max_norm, "lr": out.lr,
            "update_norm": out.update_norm, "group_update_norms": out.group_update_norms,
            "eval_before": eval_before, "eval_after_update": trainer.eval_loss(evals),
            "grad_sketch": out.sketch, "valid_tokens": out.valid_tokens, "expert_load": out.expert_load,
            "dropped_tokens": out.dropped_tokens, "recompute_mismatch": out.recompute_mismatch}


def run(cfg: ProxyConfig) -> ProxyRun:
    start = time.perf_counter()
    with _one_thread():
        step1 = probe(cfg)
        trainer = Trainer(cfg)
        evals = eval_samples(cfg)
        rows = []
        for t in range(1, cfg.steps + 1):
            interrupt.check()   # a gate run takes seconds to minutes: Ctrl-C must not wait for it
            samples = step_samples(cfg, t)
            out = trainer.step(samples, t)
            load = torch.tensor(out.expert_load)
            rows.append(CurveRow(step=t, loss=out.loss, eval_loss=trainer.eval_loss(evals),
                                 grad_norm=out.grad_norm, batch_hash=batch_hash(samples),
                                 expert_imbalance=float(load.std(unbiased=False) / load.mean()) if cfg.moe else None))
    return ProxyRun(config=cfg, rows=rows, step1=step1, seconds=time.perf_counter() - start)
