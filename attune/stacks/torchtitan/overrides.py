"""torchtitan 0.3 @override factories behind ATTUNE's float8 lever (quantize.float8).

torchtitan 0.3 applies float8 by converting the model spec inside a recipe function, and the model
spec has no command-line fields; its override mechanism is the supported way to swap components
of a built recipe. render.py names these factories in `--override.imports`, and torchtitan imports
this module in every training process (and in validation). It imports torchtitan only: no ATTUNE
modules, so the training process stays as it would be without ATTUNE.

Which layers: the ones torchtitan's own float8 recipes convert (attention, dense feed-forward and
shared-expert linears); lm_head and the MoE router gate stay in bf16, as their filter_fqns keep
them; dims not divisible by 16 are skipped (float8 tensor cores need it). Routed experts (grouped
GEMMs) are not converted. `derive` copies every field, so the sharding configs torchtitan set on
the linears before overrides run are kept.
"""

from __future__ import annotations

import torch

from torchtitan.components.quantization import float8 as tt_float8
from torchtitan.config import derive, override
from torchtitan.models.common.linear import Linear

LAYER_FQNS = ["*.layers.*.attention.*", "*.layers.*.feed_forward.*", "*.layers.*.shared_experts.*"]


def _torchao_config(recipe_name: str):
    from torchao.float8 import Float8LinearConfig
    if recipe_name == "rowwise":
        # torchtitan's converter sets this for rowwise (pytorch/pytorch#150859); so do we.
        torch._inductor.config.emulate_precision_casts = True
    return Float8LinearConfig.from_recipe_name(recipe_name)


def _check_hardware() -> None:
    # Same rule and message as torchtitan's Float8LinearConverter, through its module so a
    # CPU-side validation that targets an H100 can stand in the capability.
    if not (tt_float8.has_cuda_capability(8, 9) or tt_float8.has_rocm_capability(9, 4)):
        raise ValueError("Failed to swap to Float8Linear because float8 is only supported on "
                         "NVIDIA SM89 or later, or AMD gfx942 (MI300) or later.")


@override(target=Linear.Config, fqns=LAYER_FQNS, description="ATTUNE quantize.float8: Float8Linear")
def float8_linear(cfg, recipe_name: str = "rowwise"):
    if tt_float8.Float8Linear is None:
        raise ImportError("torchao is not installed. Please install it to use float8 linear layers.")
    if type(cfg) not in (Linear.Config, tt_float8.Float8Linear.Config):
        return cfg  # subclasses with their own forward (e.g. ScaledBiasRowwiseLinear) stay as they are
    if cfg.in_features % 16 or cfg.out_features % 16:
        return cfg
    _check_hardware()
    return derive(cfg, tt_float8.Float8Linear.Config, _torchao_config=_torchao_config(recipe_name))


def _float8_config_cls():
    # Without torchao there are no Float8Linear configs to revert: Linear -> Linear is a no-op copy.
    return tt_float8.Float8Linear.Config if tt_float8.Float8Linear is not None else Linear.Config


@override(target=_float8_config_cls(), exact=True, description="ATTUNE quantize.float8=none: back to Linear")
def float8_linear_off(cfg):
    return derive(cfg, Linear.Config)
