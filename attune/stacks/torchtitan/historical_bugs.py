"""Real silent-correctness bugs restored in torchtitan 0.3, each one `@override` factory, for the
gate's historical suite (gate/suite_historical.toml; the research, links and mechanisms are in
gate/historical_bugs.toml, keyed by the ids below).

    --override.imports attune.stacks.torchtitan.historical_bugs.<name>

Each factory puts back what the bug did, at the torchtitan 0.3 function where that behaviour
lives, in the style of faults.py: a derived Config where torchtitan has a component to swap (the
LR schedule, the loss), a patched torchtitan function where it has none (gradient clipping, the
text dataset), claiming the profiler's node (off in gate runs; torchtitan rejects two overrides on
one node, so a case uses at most one Profiler factory).

Bugs that happened across a restart (HF-5605, TT-3907) are restored in-process: at the run's
resume step R the data stream jumps to where the buggy resume put it, as a restart from a
checkpoint would (model, optimizer and schedule state are restored exactly by a checkpoint; only
the data position was wrong). R is half the run's steps, read from the gate run's settings file
(recorder.SETTINGS_ENV), so a doubled run resumes at its own middle.

The pipeline bugs (TT-1733, TT-596, TT-2972) act on the schedule torchtitan builds or on its
clipping across stages, so their cases run the candidate at pipeline parallelism 2.

Imports torch and torchtitan only (it runs inside the training processes).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from torchtitan.components.loss import IGNORE_INDEX, ChunkedLossWrapper
from torchtitan.components.optimizer import LRSchedulersContainer
from torchtitan.config import derive, override
from torchtitan.distributed import pipeline_parallel as tt_pipeline
from torchtitan.distributed import utils as tt_dist_utils
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset
from torchtitan.tools.profiler import Profiler

SETTINGS_ENV = "ATTUNE_GATE_RUN"   # recorder.SETTINGS_ENV (not imported: the recorder installs hooks at import)
TORCH_CLIP_EPS = 1e-6              # torch.nn.utils.clip_grads_with_norm_: max_norm / (total_norm + 1e-6)
MIN_VALID = 32                     # padded_labels: the shortest example keeps this many labels


def _settings() -> dict:
    path = os.environ.get(SETTINGS_ENV)
    return json.loads(Path(path).read_text()) if path else {}


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def resume_step(settings: dict) -> int:
    """The step after which the in-process 'restart' happens: the middle of the run."""
    return max(1, int(settings.get("steps", 20)) // 2)


def samples_per_source_step(settings: dict) -> int:
    """Samples one data-order source yields per optimizer step (recorder.GateOrderLoader)."""
    return int(settings.get("global_batch", 8)) // max(1, int(settings.get("order_dp", 1)))


def _patch_stream(edit) -> None:
    original = HuggingFaceTextDataset.__iter__

    def __iter__(self):
        yield from edit(self, original)

    HuggingFaceTextDataset.__iter__ = __iter__


# ---- HF-23986: the LR scheduler stepped num_processes times per optimizer step ----------------------

class _PerProcessSchedulers(LRSchedulersContainer):
    """accelerate's AcceleratedScheduler: every wrapped scheduler steps once per process."""

    def step(self) -> None:
        for _ in range(_world()):
            super().step()


@dataclass(kw_only=True, slots=True)
class _PerProcessSchedulersConfig(LRSchedulersContainer.Config):
    def build(self, *, optimizers, training_steps):
        built = LRSchedulersContainer.Config.build(self, optimizers=optimizers, training_steps=training_steps)
        built.__class__ = _PerProcessSchedulers  # same state, the buggy step()
        return built


@override(target=LRSchedulersContainer.Config, exact=True,
          description="HF-23986: the LR scheduler steps once per process per optimizer step")
def lr_scheduler_per_process(cfg):
    return derive(cfg, _PerProcessSchedulersConfig)


# ---- HF-5605: a resume under accumulation skips optimizer steps' worth of batches, not micro-batches -

def replay_after_resume(samples, consumed: int, accumulation: int):
    """The stream a buggy resume reads: the first `consumed` samples, then from consumed // G on
    (already-trained samples replayed), then fresh ones."""
    seen = []
    for sample in samples:
        seen.append(sample)
        yield sample
        if len(seen) == consumed:
            break
    else:
        return
    yield from seen[consumed // accumulation:]
    yield from samples


@override(target=Profiler.Config,
          description="HF-5605: a resume under gradient accumulation skips only global_step batches")
def resume_skips_optimizer_steps(cfg):
    settings = _settings()
    consumed = resume_step(settings) * samples_per_source_step(settings)
    accumulation = max(1, int(settings.get("accumulation", 1)))
    _patch_stream(lambda ds, original: replay_after_resume(iter(original(ds)), consumed, accumulation))
    return cfg


# ---- TT-3907: the second resume restarts the data stream from the first sample ---------------------

def restart_after_resume(make_stream, consumed: int):
    """The first `consumed` samples, then the stream again from its first sample."""
    for i, sample in enumerate(make_stream(), start=1):
        yield sample
        if i == consumed:
            break
    else:
        return
    yield from make_stream()


@override(target=Profiler.Config,
          description="TT-3907: the dataloader restarts from the first sample at the second resume")
def dataloader_restarts_on_resume(cfg):
    settings = _settings()
    consumed = resume_step(settings) * samples_per_source_step(settings)

    def edit(ds, original):
        state = (ds._sample_idx, list(ds._inputs_buffer), list(ds._labels_buffer), list(ds._positions_buffer))

        def fresh():  # a dataset whose saved position reads zero: the state it was built with
            ds._sample_idx, ds._inputs_buffer, ds._labels_buffer, ds._positions_buffer = \
                state[0], list(state[1]), list(state[2]), list(state[3])
            return original(ds)
        return restart_after_resume(fresh, consumed)
    _patch_stream(edit)
    return cfg


# ---- PT-88955: NO_SHARD clip_grad_norm_ all-reduces a replicated norm with SUM ---------------------

@torch.no_grad()
def replicated_norm_summed(norm: torch.Tensor, group=None) -> torch.Tensor:
    """FSDP's sharded-norm reduction applied to a norm every rank already holds in full."""
    squared = norm.detach().clone() ** 2
    if dist.is_initialized():
        dist.all_reduce(squared, op=dist.ReduceOp.SUM, group=group)
    return squared.sqrt()


@override(target=Profiler.Config,
          description="PT-88955: the replicated (NO_SHARD) gradient norm summed over the replicas")
def clip_norm_replicas_summed(cfg):
    # under HSDP 2 x 1 the replicate group is the world; the trainer logs the wrong norm too
    _clip_with_norm(replicated_norm_summed, reports_clip_norm=True)
    return cfg


def _clip_with_norm(clip_norm, reports_clip_norm: bool) -> None:
    """Patch torchtitan's clip_grad_norm_: reduce the true norm (no clip), clip with clip_norm(norm),
    return the clip norm or the true one, as the bug's trainer did."""
    original = tt_dist_utils.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm, *args, foreach=None, **kwargs):
        parameters = list(parameters)
        norm = original(parameters, float("inf"), *args, foreach=foreach, **kwargs)
        used = clip_norm(norm)
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, used, foreach)
        return used if reports_clip_norm else norm

    tt_dist_utils.clip_grad_norm_ = clip_grad_norm_


# ---- PT-149768: the clip epsilon added on every rank before the norm's reduction -------------------

@override(target=Profiler.Config,
          description="PT-149768: clip coefficient max_norm / (norm + world_size * 1e-6)")
def clip_epsilon_per_rank(cfg):
    # clip_grads_with_norm_ adds one epsilon itself; the bug added one per rank
    _clip_with_norm(lambda norm: norm + (_world() - 1) * TORCH_CLIP_EPS, reports_clip_norm=False)
    return cfg


# ---- TT-1842: loss normalised per micro-batch and per rank, not by the global valid tokens ---------

class _PerMicroBatchMeanLoss(ChunkedLossWrapper):
    """Each micro-batch's mean over its own valid tokens, then the 1/(G x DP) of the old code."""

    @dataclass(kw_only=True, slots=True)
    class Config(ChunkedLossWrapper.Config):
        pass

    def __call__(self, pred, labels, global_valid_tokens=None, **loss_inputs):
        settings = _settings()
        local = (labels != IGNORE_INDEX).sum()
        per_step = local * max(1, int(settings.get("accumulation", 1))) * max(1, int(settings.get("dp", _world())))
        return super().__call__(pred, labels, per_step, **loss_inputs)


@override(target=ChunkedLossWrapper.Config, exact=True,
          description="TT-1842: loss normalised per micro-batch and rank instead of by the global valid tokens")
def loss_per_microbatch_mean(cfg):
    return derive(cfg, _PerMicroBatchMeanLoss.Config)


# ---- the base TT-1842 needs: examples of different lengths, padded (labels IGNORE_INDEX) ----------

def valid_length(inputs: torch.Tensor, seq_len: int) -> int:
    """A length in [MIN_VALID, seq_len] drawn from the sample's own tokens (so every run and
    layout masks a sample the same way)."""
    digest = hashlib.sha1(inputs.numpy().tobytes()).digest()
    return MIN_VALID + int.from_bytes(digest[:4], "little") % (seq_len - MIN_VALID + 1)


def pad_labels(sample):
    inputs, labels = sample
    labels = labels.clone()
    labels[valid_length(inputs["input"], labels.numel()):] = IGNORE_INDEX
    return inputs, labels


@override(target=Profiler.Config,
          description="base for TT-1842: examples of varied length, the rest of each sample padded")
def padded_labels(cfg):
    _patch_stream(lambda ds, original: (pad_labels(s) for s in original(ds)))
    return cfg


# ---- the pipeline bugs: each edits the schedule torchtitan builds (pipeline_parallel.py) ------------

def _patch_schedule(edit) -> None:
    """Every pipeline schedule torchtitan builds goes through edit(schedule) (pipeline_llm looks
    _build_pipeline_schedule up in its module at call time)."""
    original = tt_pipeline._build_pipeline_schedule

    def _build_pipeline_schedule(*args, **kwargs):
        schedule = original(*args, **kwargs)
        edit(schedule)
        return schedule

    tt_pipeline._build_pipeline_schedule = _build_pipeline_schedule


def _stages(schedule) -> list:
    return list(getattr(schedule, "_stages", None) or [schedule._stage])


def _wrap_step(schedule, before=None, around=None) -> None:
    """schedule.step (this instance) with `before(schedule)` run first, or replaced by
    `around(original_step, *args, **kwargs)`."""
    original = schedule.step

    def step(*args, **kwargs):
        if around is not None:
            return around(original, *args, **kwargs)
        before(schedule)
        return original(*args, **kwargs)

    schedule.step = step


# TT-1733: torchtitan 0.1 left the schedule's scale_grads=True, whose end-of-step division by
# n_microbatches runs over every gradient the parameters hold; under gradient accumulation the trainer
# steps the schedule once per accumulation step, so each step divides again what the earlier ones
# accumulated (0.1 normalised each step's loss per micro-batch, which that division undid for the
# fresh gradient only): after G steps g_1/n^(G-1) + ... + g_G, an average that forgets, not a sum.

@torch.no_grad()
def rescale_accumulated(schedule) -> None:
    """What scale_grads=True did to the gradients earlier schedule steps left: divided by n again."""
    n = schedule._n_microbatches
    for stage in _stages(schedule):
        for param in stage.submod.parameters():
            if param.grad is not None:
                param.grad.div_(n)


@override(target=Profiler.Config,
          description="TT-1733: the pipeline schedule rescales the accumulated gradients at every accumulation step")
def pipeline_rescales_accumulated_grads(cfg):
    _patch_schedule(lambda schedule: _wrap_step(schedule, before=rescale_accumulated))
    return cfg


# TT-596: clip_grad_norm_ reduced the norm only over the DTensor mesh dims of the parameters; pipeline
# stages are separate modules, so each stage clipped with the norm of its own parameters.

@override(target=Profiler.Config,
          description="TT-596: gradient clipping under PP uses each stage's own norm, not the global one")
def clip_norm_per_stage(cfg):
    original = tt_dist_utils.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm, *args, pp_mesh=None, **kwargs):
        return original(parameters, max_norm, *args, pp_mesh=None, **kwargs)   # no reduction over stages

    tt_dist_utils.clip_grad_norm_ = clip_grad_norm_
    return cfg


# TT-2972: the PP path handed the schedule no global_valid_tokens, so each micro-batch's backward
# ran on its raw summed loss, and the trainer divided the returned losses afterwards, for logging
# only: gradients global_valid_tokens times the non-PP ones, the logged loss unchanged.

def backward_on_raw_sum(original, *args, loss_kwargs=None, losses=None, **kwargs):
    loss_kwargs = dict(loss_kwargs or {})
    tokens = loss_kwargs.pop("global_valid_tokens", None)
    out = original(*args, loss_kwargs=loss_kwargs, losses=losses, **kwargs)
    if losses is not None and tokens is not None:
        losses[:] = [loss / tokens for loss in losses]
    return out


@override(target=Profiler.Config,
          description="TT-2972: under PP the schedule backwards the raw summed loss, normalised only for logging")
def pipeline_backward_raw_sum(cfg):
    _patch_schedule(lambda schedule: _wrap_step(schedule, around=backward_on_raw_sum))
    return cfg


BUGS = {"HF-23986": "lr_scheduler_per_process", "HF-5605": "resume_skips_optimizer_steps",
        "TT-3907": "dataloader_restarts_on_resume", "PT-88955": "clip_norm_replicas_summed",
        "TT-1842": "loss_per_microbatch_mean", "PT-149768": "clip_epsilon_per_rank",
        "TT-1733": "pipeline_rescales_accumulated_grads", "TT-596": "clip_norm_per_stage",
        "TT-2972": "pipeline_backward_raw_sum",
        "AT-ZBV-NORM": None}   # a bug of the installed stack itself: nothing to restore
