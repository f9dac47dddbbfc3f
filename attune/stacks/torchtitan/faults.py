"""Faults injected into torchtitan 0.3 itself, each one `@override` factory, for the gate's fault suite.

    --override.imports attune.stacks.torchtitan.faults.<name>

Each is a silent correctness bug of the kind that lets a job run to completion while it trains
something else; the config check cannot see any of them (the recipe is unchanged), so only the
convergence check on real curves and step-1 records can. Where torchtitan has a component to swap
(optimizer, LR schedule, loss), the fault is a derived Config whose class misbehaves; where the bug
lives inside a torchtitan function (gradient clipping, the text dataset), the factory patches that
function and returns its node unchanged. Those claim the profiler's Config (off in gate runs, and
claimed by no other override: torchtitan rejects two overrides on one node).

Imports torch and torchtitan only (it runs inside the training processes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from torchtitan.components.loss import IGNORE_INDEX, ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.config import derive, override
from torchtitan.distributed import utils as tt_dist_utils
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset
from torchtitan.tools.profiler import Profiler

EVERY = 4  # the data faults act on every 4th sample


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


# ---- optimizer and schedule ------------------------------------------------------------------------

def _with_optimizer_kwargs(cfg, changes):
    groups = [replace(g, optimizer_kwargs=dict(g.optimizer_kwargs) | changes(g.optimizer_kwargs))
              for g in cfg.param_groups]
    return replace(cfg, param_groups=groups)


@override(target=OptimizersContainer.Config, description="fault: the learning rate is doubled inside the trainer")
def lr_doubled(cfg):
    return _with_optimizer_kwargs(cfg, changes=lambda kw: {"lr": 2.0 * kw["lr"]})


@override(target=OptimizersContainer.Config, description="fault: AdamW's weight decay is dropped")
def weight_decay_dropped(cfg):
    return _with_optimizer_kwargs(cfg, changes=lambda kw: {"weight_decay": 0.0})


@override(target=LRSchedulersContainer.Config, description="fault: the LR warm-up is skipped")
def warmup_skipped(cfg):
    return replace(cfg, warmup_steps=0)


# ---- loss ------------------------------------------------------------------------------------------

class _LocalTokensLoss(ChunkedLossWrapper):
    """Each micro-step's loss normalised by its own valid tokens, not the whole step's."""

    @dataclass(kw_only=True, slots=True)
    class Config(ChunkedLossWrapper.Config):
        pass

    def __call__(self, pred, labels, global_valid_tokens=None, **loss_inputs):
        return super().__call__(pred, labels, (labels != IGNORE_INDEX).sum(), **loss_inputs)


class _ShiftedLabelsLoss(ChunkedLossWrapper):
    """Labels one position too far: each token is trained to predict the one after next."""

    @dataclass(kw_only=True, slots=True)
    class Config(ChunkedLossWrapper.Config):
        pass

    def __call__(self, pred, labels, global_valid_tokens=None, **loss_inputs):
        shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
        return super().__call__(pred, shifted, global_valid_tokens, **loss_inputs)


class _SmoothedLoss(CrossEntropyLoss):
    """Cross-entropy with label smoothing 0.1: another objective, the same recipe."""

    @dataclass(kw_only=True, slots=True)
    class Config(CrossEntropyLoss.Config):
        pass

    def __init__(self, config, *, compile_config=None):
        super().__init__(config, compile_config=compile_config)
        self.fn = lambda pred, labels, **_: F.cross_entropy(
            pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=IGNORE_INDEX,
            label_smoothing=0.1)


class _RankDroppedLoss(CrossEntropyLoss):
    """Rank 1 contributes nothing to the gradient reduction (a reduce that drops a rank's share)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CrossEntropyLoss.Config):
        pass

    def __call__(self, pred, labels, global_valid_tokens=None, **kwargs):
        loss, extra = super().__call__(pred, labels, global_valid_tokens, **kwargs)
        return (loss * 0.0 if _rank() == 1 else loss), extra


@override(target=ChunkedLossWrapper.Config, exact=True,
          description="fault: gradient accumulation not divided (each micro-step normalised by its own tokens)")
def accumulation_not_divided(cfg):
    return derive(cfg, _LocalTokensLoss.Config)


@override(target=ChunkedLossWrapper.Config, exact=True, description="fault: labels shifted by one more token")
def labels_shifted(cfg):
    return derive(cfg, _ShiftedLabelsLoss.Config)


@override(target=CrossEntropyLoss.Config, exact=True, description="fault: label smoothing 0.1 inside the loss")
def label_smoothing(cfg):
    return derive(cfg, _SmoothedLoss.Config)


@override(target=CrossEntropyLoss.Config, exact=True, description="fault: rank 1's gradient share is dropped")
def rank_share_dropped(cfg):
    return derive(cfg, _RankDroppedLoss.Config)


# ---- inside torchtitan functions (claimed on the profiler's node) -----------------------------------

@override(target=Profiler.Config, description="fault: gradient clipping computes the norm but never clips")
def clipping_skipped(cfg):
    # the original held in the closure: a wrapper installed later (the recorder's GPU-like noise)
    # replaces the module attribute, and a look-up through it would find the wrapper
    original = tt_dist_utils.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
        return original(parameters, float("inf"), *args, **kwargs)

    tt_dist_utils.clip_grad_norm_ = clip_grad_norm_
    return cfg


@override(target=Profiler.Config, description="fault: reduced gradients rounded to bfloat16 before the update")
def grads_reduced_bf16(cfg):
    original = tt_dist_utils.clip_grad_norm_

    @torch.no_grad()
    def clip_grad_norm_(parameters, *args, **kwargs):
        parameters = list(parameters)
        for p in parameters:
            if p.grad is not None:
                p.grad.copy_(p.grad.to(torch.bfloat16).to(p.grad.dtype))
        return original(parameters, *args, **kwargs)

    tt_dist_utils.clip_grad_norm_ = clip_grad_norm_
    return cfg


def _patch_samples(edit) -> None:
    original = HuggingFaceTextDataset.__iter__

    def __iter__(self):
        yield from edit(original(self))

    HuggingFaceTextDataset.__iter__ = __iter__


@override(target=Profiler.Config, description="fault: the text dataset repeats every 4th sample")
def data_repeats(cfg):
    def edit(samples):
        for i, sample in enumerate(samples, start=1):
            yield sample
            if i % EVERY == 0:
                yield sample
    _patch_samples(edit)
    return cfg


@override(target=Profiler.Config, description="fault: the text dataset skips every 4th sample")
def data_skips(cfg):
    def edit(samples):
        for i, sample in enumerate(samples, start=1):
            if i % EVERY:
                yield sample
    _patch_samples(edit)
    return cfg


FAULTS = ("lr_doubled", "weight_decay_dropped", "warmup_skipped", "accumulation_not_divided", "labels_shifted",
          "label_smoothing", "rank_share_dropped", "clipping_skipped", "grads_reduced_bf16", "data_repeats",
          "data_skips")
