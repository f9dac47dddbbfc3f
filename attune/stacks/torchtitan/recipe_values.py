"""What each torchtitan 0.3 recipe (a config_registry function) sets, for the [config] keys ATTUNE knows.

render.py emits a command-line override only where a recipe's value differs from the torchtitan
recipe's own, so a public recipe renders to just `--module M --config C`. The values are data
(recipe_values.toml), regenerated from the installed wheel with

    python -m attune.stacks.torchtitan.recipe_values --write

and a test compares the shipped file with the wheel wherever torchtitan imports. Reading the file
needs no torchtitan.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import sys
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

VALUES_FILE = Path(__file__).with_name("recipe_values.toml")

# torchtitan modules whose recipes train models of our catalog's families.
MODULES = ("llama3", "deepseek_v3", "qwen3", "gpt_oss")

AC_MODE, FLOAT8, COMPILE_COMPONENTS, OVERRIDE_IMPORTS = (
    "activation_checkpoint.mode", "quantize.float8", "compile.components", "override.imports")

# Plain fields: our dotted key is torchtitan's attribute path (its dataclass field names, 0.3).
PLAIN_FIELDS = (
    "training.local_batch_size", "training.global_batch_size", "training.seq_len", "training.max_norm",
    "training.steps", "training.dtype", "training.mixed_precision_param", "training.mixed_precision_reduce",
    "training.disable_cuda_graphs",
    "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
    "parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
    "parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_microbatch_size",
    "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree",
    "compile.enable", "compile.enable_async_tensor_parallel",
    "lr_scheduler.warmup_steps", "lr_scheduler.decay_ratio", "lr_scheduler.decay_type",
    "lr_scheduler.min_lr_factor", "lr_scheduler.total_steps",
    "dataloader.dataset", "debug.seed",
)
# The optimizer is a list of parameter groups in 0.3; recipes built with default_adamw have one.
OPTIMIZER_PREFIX = "optimizer.param_groups.0"
OPTIMIZER_KWARGS = ("lr", "eps", "weight_decay")  # betas is a pair: not a scalar recipe value


@functools.cache
def load_values() -> dict[str, dict[str, Any]]:
    """{"llama3.llama3_8b": {dotted key: value}} from the shipped data file."""
    raw = tomllib.loads(VALUES_FILE.read_text())
    return {f"{module}.{name}": values for module, configs in raw.items() for name, values in configs.items()}


def recipe_values(module: str, config: str) -> dict[str, Any] | None:
    """The values torchtitan's recipe `config` of `module` sets, or None if it is not in the data."""
    return load_values().get(f"{module}.{config}")


# ---- extraction from the installed wheel (needs torchtitan) ---------------------------------

def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _ac_mode(ac_config: Any) -> str:
    if ac_config is None:
        return "none"
    from torchtitan.distributed.activation_checkpoint import FullAC, MemoryBudgetAC, SelectiveAC
    for cls, mode in ((SelectiveAC, "selective"), (FullAC, "full"), (MemoryBudgetAC, "memory-budget")):
        if type(ac_config) is cls.Config:
            return mode
    return type(ac_config).__qualname__


def _float8(model_config: Any) -> str:
    """none, or the torchao float8 recipe name of the recipe's Float8Linear layers."""
    from torchao.float8 import Float8LinearConfig
    from torchtitan.components.quantization.float8 import Float8Linear
    if Float8Linear is None:
        return "none"
    found = [cfg for _fqn, cfg, _p, _a in model_config.traverse(Float8Linear.Config)]
    if not found:
        return "none"
    for name in ("rowwise", "rowwise_with_gw_hp", "tensorwise"):
        if found[0]._torchao_config == Float8LinearConfig.from_recipe_name(name):
            return name
    return "custom"


def extract(config: Any) -> dict[str, Any]:
    """The scalar values of a built Trainer.Config for ATTUNE's keys (None values left out)."""
    out: dict[str, Any] = {key: _get(config, key) for key in PLAIN_FIELDS}
    groups = config.optimizer.param_groups
    if len(groups) == 1:
        out[f"{OPTIMIZER_PREFIX}.optimizer_name"] = groups[0].optimizer_name
        for kwarg in OPTIMIZER_KWARGS:
            out[f"{OPTIMIZER_PREFIX}.optimizer_kwargs.{kwarg}"] = groups[0].optimizer_kwargs.get(kwarg)
    out[COMPILE_COMPONENTS] = ",".join(config.compile.components)
    out[AC_MODE] = _ac_mode(config.activation_checkpoint)
    out[FLOAT8] = _float8(config.model_spec.model)
    imports = [entry if isinstance(entry, str) else entry[0] for entry in config.override.imports]
    if imports:
        out[OVERRIDE_IMPORTS] = ",".join(imports)
    return {k: v for k, v in out.items() if v is not None}


def pretend_float8_hardware() -> None:
    """Float8 converters check the GPU (SM89+) while a recipe is *built*; on a CPU machine we
    validate for the GPU the recipe targets, so report that capability. Never used in training."""
    import torchtitan.components.quantization.float8 as float8
    float8.has_cuda_capability = lambda major, minor: True


def wheel_configs():
    """(module, recipe name, config) for every recipe of MODULES that builds on this machine."""
    pretend_float8_hardware()
    for module_name in MODULES:
        module = importlib.import_module(f"torchtitan.models.{module_name}.config_registry")
        for name, fn in sorted(inspect.getmembers(module, inspect.isfunction)):
            if fn.__module__ != module.__name__ or name.startswith("_") or inspect.signature(fn).parameters:
                continue
            try:
                config = fn()
            except Exception as err:  # a recipe that needs files or hardware we lack: left out
                print(f"skip {module_name}.{name}: {type(err).__name__}: {err}", file=sys.stderr)
                continue
            if hasattr(config, "model_spec") and hasattr(config, "training"):
                yield module_name, name, config


def wheel_values() -> dict[str, dict[str, dict[str, Any]]]:
    """{module: {config: values}} for every recipe of MODULES that builds on this machine."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for module_name, name, config in wheel_configs():
        out.setdefault(module_name, {})[name] = extract(config)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Dump torchtitan recipe values for ATTUNE's keys.")
    parser.add_argument("--write", action="store_true", help=f"write {VALUES_FILE.name} (else print)")
    args = parser.parse_args(argv)
    header = ("# Generated by `python -m attune.stacks.torchtitan.recipe_values --write` from the installed\n"
              "# torchtitan wheel: the values each torchtitan recipe sets for ATTUNE's [config] keys.\n")
    text = header + tomli_w.dumps(wheel_values())
    if args.write:
        VALUES_FILE.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
