"""torchtitan 0.3 on a CPU-only machine, loaded as torchtitan loads an out-of-tree config registry.

    torchrun ... -m torchtitan.train --module attune.stacks.torchtitan.cpu --config llama3_debugmodel

`--module` takes a fully qualified module path, and torchtitan's ConfigManager imports it while it
parses the command line, before the Trainer exists. That is early enough; `--override.imports` is
not: the Trainer imports override modules in apply_overrides (trainer.py, after
`device_module.set_device` and `init_distributed`), by which time a CPU-only torch has already
failed in torch.cuda.set_device. Every config function of torchtitan's own registries is
reachable here by its name (`__getattr__` below), so a recipe keeps its `--config`.

torchtitan picks its device once, at import (`torchtitan.tools.utils.device_type`, which falls back
to "cuda" when no accelerator is found), and five modules copy that name at their own import. This
module points them all at the CPU:
  device type     "cpu" (so the model, buffers and DTensor meshes live on the CPU)
  process group   gloo (torch's default backend for "cpu"; torchtitan asks the backend map)
  device module   `CpuDevice` below: torch.cpu has no memory statistics, device name or
                  properties, which torchtitan's DeviceMemoryMonitor reads; peak memory is the
                  process's peak resident set (what a CPU run holds), capacity the machine's RAM,
                  and a resident set above the cluster's per-process memory is an out-of-memory
                  error, as on a GPU

It imports torchtitan and torch only, like overrides.py: the training process stays as it would be
without ATTUNE. What does not run on the CPU is left to fail loudly (float8 needs SM89+, CUDA
graphs are off by default in the debug recipes).
"""

from __future__ import annotations

import importlib
import os
import resource
import sys

import torch

from torchtitan.components import metrics as tt_metrics
from torchtitan.tools import utils as tt_utils

# Modules that did `from torchtitan.tools.utils import device_type[, device_module]` at import.
_COPIES = ("torchtitan.components.metrics", "torchtitan.models.common.token_dispatcher",
           "torchtitan.distributed.parallel_dims", "torchtitan.distributed.utils", "torchtitan.tools.profiler")


# The memory one process may hold, in GiB (the cpu cluster's hbm_gib; render.py sets it).
MEMORY_LIMIT_ENV = "ATTUNE_CPU_MEMORY_LIMIT_GIB"


class _Properties:
    def __init__(self, total_memory: int):
        self.total_memory = total_memory


class CpuDevice:
    """The parts of torch.cuda's interface torchtitan calls, for the CPU."""

    type = "cpu"

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1  # every rank is "device 0" of its own process: get_local_device() -> cpu:0

    @staticmethod
    def set_device(device) -> None:
        return None

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def synchronize(device=None) -> None:
        return None

    @staticmethod
    def get_device_name(device=None) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(device=None) -> _Properties:
        return _Properties(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        return None  # the peak resident set cannot be reset; it only grows over the run

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def memory_stats(device=None) -> dict[str, int]:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
        limit = float(os.environ.get(MEMORY_LIMIT_ENV, "0") or 0) * 2**30
        if limit and peak > limit:
            # A GPU that runs out of memory raises this at the allocation; a CPU process would only
            # swap. torchtitan's memory monitor reads these stats every logged step, so a run whose
            # resident set passes the cluster's per-process memory ends there, reported as an OOM.
            raise torch.OutOfMemoryError(f"CPU out of memory: peak resident set {peak / 2**30:.2f} GiB is above "
                                         f"the {limit / 2**30:.2f} GiB one process may hold ({MEMORY_LIMIT_ENV})")
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak,
                "num_alloc_retries": 0, "num_ooms": 0}

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)


DEVICE = CpuDevice()


def use_cpu() -> None:
    """Point torchtitan's device globals (and every copy of them) at the CPU."""
    tt_utils.device_type, tt_utils.device_module = "cpu", DEVICE
    for name in _COPIES:
        module = sys.modules.get(name)
        if module is None:
            continue
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = DEVICE
    # DeviceMemoryMonitor's default argument was bound at import; build it for the CPU explicitly.
    tt_metrics.build_device_memory_monitor = lambda: tt_metrics.DeviceMemoryMonitor("cpu")
    if not hasattr(torch.distributed, "set_timeout"):
        # The CPU build of torch 2.13 has no torch.distributed.set_timeout, which the Trainer calls
        # after step 1 to shorten collective timeouts; gloo keeps its init timeout instead.
        from torchtitan.distributed import utils as tt_dist_utils
        tt_dist_utils.set_pg_timeouts = lambda timeout, parallel_dims: torch.distributed.barrier()
    _fsdp_sum_then_divide()
    _pipeline_step_takes_microbatches()


def _pipeline_step_takes_microbatches() -> None:
    """torchtitan 0.3 hands its pipeline schedule microbatches it split itself
    (`schedule.step(arg_mbs=…, kwarg_mbs=…, target_mbs=…)`, trainer.pp_forward_backward_step), but
    torch 2.13's `step` takes the whole batch and splits it again, so every pipeline-parallel run
    failed at step 1 with "Expecting 2 arg_mbs but got 1". Such a call goes here to the schedule's
    own per-microbatch entry point (`_step_microbatches`, which `step` itself ends in) after the
    same per-iteration reset `step` does: the same schedule over the same microbatches."""
    from torch.distributed.pipelining import schedules
    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        original = cls.step
        if getattr(original, "attune_cpu", False):
            continue

        def step(self, *args, _original=original, arg_mbs=None, kwarg_mbs=None, target_mbs=None,
                 losses=None, return_outputs=True, loss_kwargs=None, **kwargs):
            if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
                return _original(self, *args, losses=losses, return_outputs=return_outputs,
                                 loss_kwargs=loss_kwargs, **kwargs)
            stages = getattr(self, "_stages", None) or [self._stage]
            for stage in stages:
                stage.has_backward = self._has_backward
                stage.clear_runtime_states()
            self._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs,
                                    loss_kwargs=loss_kwargs)
            for stage in stages:
                if stage.is_last and return_outputs:
                    return self._merge_outputs(stage.output_chunks)
            return None

        step.attune_cpu = True
        cls.step = step


def _fsdp_sum_then_divide() -> None:
    """FSDP2 reduces gradients with ReduceOp.PREMUL_SUM(1/factor) when torchtitan sets a divide
    factor, and gloo has no PREMUL_SUM ("Cannot use ReduceOp.PREMUL_SUM with Gloo"). FSDP2's own
    switch for backends without it (force_sum_reduction_for_comms, set for MTIA) sums and then
    divides by the same factor: the same gradient, in two steps."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives
    original = collectives._get_gradient_divide_factors
    if getattr(original, "attune_cpu", False):
        return

    def divide_factors(rs_group, ar_group, reduce_dtype, device_type="", factor=None, force_sum=False):
        return original(rs_group, ar_group, reduce_dtype, device_type, factor, True)

    divide_factors.attune_cpu = True
    collectives._get_gradient_divide_factors = divide_factors


use_cpu()


# torchtitan's model packages, searched in this order for a --config name.
MODEL_MODULES = ("llama3", "qwen3", "deepseek_v3", "gpt_oss", "qwen3_5", "kimi_k2_7", "muse_glimmer", "flux")


def __getattr__(name: str):
    """A config function of torchtitan's registries, by name (what ConfigManager asks for)."""
    if name.startswith("_"):
        raise AttributeError(name)
    for model in MODEL_MODULES:
        try:
            registry = importlib.import_module(f"torchtitan.models.{model}.config_registry")
        except ImportError:
            continue
        if callable(getattr(registry, name, None)):
            return getattr(registry, name)
    raise AttributeError(f"no torchtitan config function named {name!r} in {', '.join(MODEL_MODULES)}")


# ---- attention: the one compute path of the debug models with no CPU backward ------------------
#
# Language models in 0.3 use FlexAttention with a block-causal (per-document) BlockMask, and
# flex_attention raises "FlexAttention does not support backward on CPU". This override swaps it
# for the same mask evaluated elementwise (BlockMask.mask_mod, torch's own create_mask) and fed to
# scaled_dot_product_attention: the same attention, another kernel. It is an override (applied
# before the model is built), so it needs `--override.imports
# attune.stacks.torchtitan.cpu.cpu_attention` beside `--module attune.stacks.torchtitan.cpu`.

from dataclasses import dataclass  # noqa: E402

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.flex_attention import create_mask  # noqa: E402
from torchtitan.config import derive, override  # noqa: E402
from torchtitan.models.common.attention import FlexAttention  # noqa: E402


class CpuMaskedAttention(FlexAttention):
    """FlexAttention's forward contract, computed by SDPA with the BlockMask made dense."""

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        pass

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, score_mod=None, scale=None,
                enable_gqa=False, out_transform=None, **kwargs):
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError("ATTUNE's CPU attention supports neither score_mod nor out_transform")
        q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
        batch, _, q_len, _ = q.shape
        mask = create_mask(attention_masks.mask_mod, batch, None, q_len, k.shape[2], device=q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)


@override(target=FlexAttention.Config, exact=True,
          description="ATTUNE CPU: FlexAttention -> the same mask through scaled_dot_product_attention")
def cpu_attention(cfg):
    return derive(cfg, CpuMaskedAttention.Config)
