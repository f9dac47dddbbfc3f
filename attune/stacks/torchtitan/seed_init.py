"""The weights every gate run of a verdict starts from: torchtitan's seed checkpoint, with the gate's
seeded draw, loaded as an override into the one-process run that makes it:

    --checkpoint.enable --checkpoint.create_seed_checkpoint
    --override.imports attune.stacks.torchtitan.seed_init.seeded_weights={"init_seed": 0}

Why a seed checkpoint: torchtitan initialises each pipeline stage on its own rank, from a seed that
differs by stage (`distinct_seed_mesh_dims=["pp"]`), and draws DTensor weights differently under TP
and FSDP, so two layouts of one recipe start from other weights unless they load the same
checkpoint; torchtitan's own cross-layout numerics tests compare layouts this way. The run that
makes it has one process and no parallelism (torchtitan asserts a world size of 1), so it holds the
whole model once; every gate run of the verdict then loads it (`--checkpoint.initial_load_path
.../checkpoint/step-0 --checkpoint.load_only`), resharded to its own layout by DCP.

Which weights: every matrix from its own seeded draw, N(0, INIT_STD^2) by its parameter name
(crc32 of the name, so the draw does not depend on the order parameters are built in), vectors (norm
weights) as torchtitan sets them. This is the draw the gate's runs used before they loaded a seed
checkpoint (each run drew it in its first forward), so curves of layouts that did draw it are the
same with the checkpoint; it now reaches every pipeline stage, and every local stage of an
interleaved schedule, too.

Imports torch and torchtitan only (it runs inside the training process).
"""

from __future__ import annotations

import zlib

import torch

from torchtitan.components.metrics import MetricsProcessor
from torchtitan.config import override
from torchtitan.protocols.model import BaseModel

INIT_STD = 0.02          # the classic transformer init for every matrix; vectors (norms) keep theirs
# Wrappers that recomputation and compilation put around a module rename its parameters
# (layers.0._checkpoint_wrapped_module.attention.wqkv.weight): a weight is drawn by its name without them.
_WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module")


def canonical_name(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


@torch.no_grad()
def draw(model: torch.nn.Module, init_seed: int) -> None:
    """Every matrix of `model` from its own seeded draw, by canonical name."""
    for raw, param in model.named_parameters():
        if param.dim() < 2:
            continue  # norm weights: constants, the same under every layout
        name = canonical_name(raw)
        gen = torch.Generator().manual_seed(init_seed * 1_000_003 + zlib.crc32(name.encode()))
        param.copy_(torch.randn(tuple(param.shape), generator=gen, dtype=torch.float32) * INIT_STD)


# The metrics node, which no fault or historical bug claims: torchtitan refuses two overrides on one
# node, and a recipe's own overrides (a historical case's padded labels) claim the profiler's.
@override(target=MetricsProcessor.Config, description="ATTUNE seed checkpoint: every matrix from the gate's seeded draw")
def seeded_weights(cfg, init_seed: int = 0):
    # the trainer initialises the model through BaseModel.init_weights (buffers, then parameters);
    # the draw follows it, before the seed checkpoint is saved
    original = BaseModel.init_weights

    def init_weights(self, **kwargs):
        original(self, **kwargs)
        draw(self, int(init_seed))

    BaseModel.init_weights = init_weights
    return cfg
