"""A Recipe rendered to the exact torchtitan 0.3 launch: torchrun argv (a list, never a shell
string) and the environment it needs, returned separately.

    torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint H:P --rdzv-id ID
             --local-ranks-filter 0 --role rank --tee 3     (pp > 1: "0,LAST", the first and last local rank)
             -m torchtitan.train --module M --config C [--section.field value ...] [activation-checkpoint:X]

One override per [config] field whose value differs from what torchtitan's recipe C sets
(recipe_values.toml), so a public recipe renders to `--module M --config C` alone. Every lever of
the layout ATTUNE resolved is one of those fields, also where the recipe is silent: ATTUNE resolves
a silent lever to the catalog's default (levers.toml) and torchtitan to its recipe's own value,
which can differ (llama3_debugmodel sets Interleaved1F1B where the catalog's default is 1F1B), and
the layout a trial records must be the one that ran (readback.py checks it after every run).
Pipeline-only levers are passed only when pp > 1, dp_shard only when the recipe sets it (-1 means
"what is left" to both). How 0.3 spells ATTUNE's two lever keys:
  activation_checkpoint.mode -> the tyro subcommand `activation-checkpoint:none|selective|full`
                                (0.3 selects the AC policy class by subcommand; it must come last)
  quantize.float8            -> `--override.imports` of the factories in overrides.py (0.3 builds
                                float8 into the model spec, which has no command-line fields)
Booleans are tyro flags (`--compile.enable` / `--compile.no-enable`), lists comma-separated.

On a `cpu` cluster (torchtitan on a CPU-only machine, cpu.py) the launch differs in four places:
`--module attune.stacks.torchtitan.cpu` (which keeps the recipe's --config), the CPU attention
override first in `--override.imports`, `--parallelism.spmd_backend partial_dtensor` (FSDP's
default spmd_types backend needs DTensors on the full SPMD mesh, which the CPU path does not
build) and `torchrun --standalone` (a free local port, so that runs can overlap) with
OMP_NUM_THREADS shared out between the processes.
"""

from __future__ import annotations

import functools
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from attune.errors import InputError
from attune.layout import AC_MODE, COMPILE, DP_SHARD, EP, FLOAT8, PP_MICROBATCH, PP_SCHEDULE, SEQ_LEN, resolve_layout
from attune.recipe import Recipe
from attune.stacks.torchtitan.recipe_values import OVERRIDE_IMPORTS, recipe_values

OVERRIDES_MODULE = "attune.stacks.torchtitan.overrides"
FLOAT8_ON, FLOAT8_OFF = f"{OVERRIDES_MODULE}.float8_linear", f"{OVERRIDES_MODULE}.float8_linear_off"
# torchtitan 0.3's Float8LinearConverter.Config.recipe_name allows only these; tensorwise is gone.
FLOAT8_RECIPES = ("rowwise", "rowwise_with_gw_hp")
AC_SUBCOMMANDS = ("none", "selective", "full", "memory-budget")
DEFAULT_PORT = 29500
CPU_MODULE = "attune.stacks.torchtitan.cpu"
CPU_ATTENTION = f"{CPU_MODULE}.cpu_attention"
SPMD_BACKEND = "parallelism.spmd_backend"
RDZV_FROM_ENV = "env"

# Why each variable: fragmentation costs large models several GiB (torchtitan's run_train.sh
# sets the same); NCCL_DEBUG=WARN makes NCCL failures print lines the log parser recognises.
BASE_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_DEBUG": "WARN"}


class Launch(BaseModel):
    """One rendered launch. train_args is what torchtitan's ConfigManager parses."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    argv: list[str]
    env: dict[str, str]
    train_args: list[str]
    nnodes: int
    nproc_per_node: int

    def payload(self) -> dict[str, Any]:
        return {"argv": self.argv, "env": self.env}


@functools.cache
def field_aliases() -> dict[str, str]:
    return tomllib.loads(Path(__file__).with_name("field_aliases.toml").read_text())["aliases"]


def canonical_config(config: dict[str, Any]) -> dict[str, Any]:
    """[config] with older/shorter field names mapped to torchtitan 0.3's (field_aliases.toml)."""
    aliases = field_aliases()
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = aliases.get(key, key)
        if name in out and out[name] != value:
            raise InputError(f"config.{key}", f"sets {name} twice with different values")
        out[name] = value
    return out


def _value_args(key: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        section, _, field = key.rpartition(".")
        return [f"--{section + '.' if section else ''}{field if value else 'no-' + field}"]
    if isinstance(value, float):
        return [f"--{key}", repr(value)]
    return [f"--{key}", str(value)]


def _torchtitan_launch(recipe: Recipe) -> tuple[str, str]:
    if recipe.torchtitan is None:
        raise InputError(f"{recipe.name}: torchtitan", "the recipe has no [torchtitan] module/config to launch")
    return recipe.torchtitan.module, recipe.torchtitan.config


def _float8_imports(wanted: str, own: str) -> list[str]:
    """override.imports entries that turn the recipe's float8 from `own` into `wanted`."""
    if wanted == own:
        return []
    if wanted not in ("none", *FLOAT8_RECIPES):
        raise InputError(FLOAT8, f"torchtitan 0.3 offers float8 recipes {', '.join(FLOAT8_RECIPES)} "
                                 f"(Float8LinearConverter.Config.recipe_name); {wanted!r} is not available")
    if wanted == "none":
        return [FLOAT8_OFF]
    return [f"{FLOAT8_ON}={json.dumps({'recipe_name': wanted})}"]


def on_cpu(recipe: Recipe) -> bool:
    return recipe.cluster.accelerator == "cpu"


def train_args(recipe: Recipe, extra: dict[str, Any] | None = None) -> list[str]:
    """`--module M --config C` and the overrides, in the order torchtitan's CLI needs."""
    module, config_name = _torchtitan_launch(recipe)
    own = recipe_values(module, config_name) or {}
    config = canonical_config(dict(recipe.config)) | canonical_config(dict(extra or {}))
    if on_cpu(recipe):
        config.setdefault(SPMD_BACKEND, "partial_dtensor")
    # Companions follow the launch as rendered, trial extras included.
    layout = resolve_layout(config, recipe.architecture, recipe.cluster, check=False)
    config = _explicit_levers(layout) | config
    config |= _companions(config, own, layout)
    args: list[str] = ["--module", CPU_MODULE if on_cpu(recipe) else module, "--config", config_name]
    for key in sorted(config):
        value = config[key]
        if key in (AC_MODE, FLOAT8, OVERRIDE_IMPORTS):
            continue
        if key in own and own[key] == value and type(own[key]) is type(value):
            continue
        args += _value_args(key, value)
    # --override.imports replaces the recipe's list, so it repeats the entries the recipe has.
    imports = _split(config.get(OVERRIDE_IMPORTS, own.get(OVERRIDE_IMPORTS, "")))
    imports += _float8_imports(str(config.get(FLOAT8, own.get(FLOAT8, "none"))),
                               str(own.get(FLOAT8, "none")))
    if on_cpu(recipe) and CPU_ATTENTION not in imports:
        imports.insert(0, CPU_ATTENTION)
    if imports != _split(own.get(OVERRIDE_IMPORTS, "")):
        args += ["--override.imports", *imports]
    mode = str(config.get(AC_MODE, own.get(AC_MODE, "selective")))
    if mode not in AC_SUBCOMMANDS:
        raise InputError(AC_MODE, f"torchtitan 0.3 activation checkpointing is one of {', '.join(AC_SUBCOMMANDS)}")
    if AC_MODE in config and mode != own.get(AC_MODE):
        args.append(f"activation-checkpoint:{mode}")  # a tyro subcommand: after every --field
    return args


def _explicit_levers(layout: Any) -> dict[str, Any]:
    """The resolved layout's levers (and sequence length) as fields, for those the recipe leaves to a
    default: torchtitan's recipe may default them otherwise than the lever catalog does."""
    fields = dict(layout.levers()) | {SEQ_LEN: layout.seq_len}
    fields.pop(DP_SHARD)                      # derived: -1 resolves the same on both sides
    if layout.pp == 1:                        # inert without a pipeline
        fields.pop(PP_SCHEDULE)
        fields.pop(PP_MICROBATCH)
    return fields


def _split(text: Any) -> list[str]:
    return [entry for entry in str(text).split(",") if entry]


def _companions(config: dict[str, Any], own: dict[str, Any], layout: Any) -> dict[str, Any]:
    """Settings torchtitan 0.3 itself requires once a lever has moved (its Trainer.Config and
    CompileConfig checks), forced so that the move is valid instead of rejected."""
    def effective(key: str, default: Any = None) -> Any:
        return config.get(key, own.get(key, default))

    forced: dict[str, Any] = {}
    graphs_off = "training.disable_cuda_graphs"
    # CUDA graphs (on by default in 0.3) support neither PP nor EP with the standard dispatcher.
    if not effective(graphs_off, False) and (layout.pp > 1 or (layout.ep > 1 and own.get(EP, 1) == 1)):
        forced[graphs_off] = True
    async_tp = "compile.enable_async_tensor_parallel"
    if effective(async_tp, False) and not effective(COMPILE, False):
        forced[async_tp] = False  # async TP needs the compiled model
    return forced


def rendezvous(nnodes: int, endpoint: str | None, run_id: str | None, name: str) -> tuple[str, str]:
    """Endpoint: argument, else ATTUNE_RDZV_ENDPOINT, else MASTER_ADDR[:MASTER_PORT] (set by Slurm
    scripts and Kubernetes jobs), else localhost for a one-node run. "env" leaves it to each node
    (torchrun reads PET_RDZV_ENDPOINT; node_entry.py sets it on work-pool nodes)."""
    endpoint = endpoint or os.environ.get("ATTUNE_RDZV_ENDPOINT")
    if not endpoint and os.environ.get("MASTER_ADDR"):
        endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', DEFAULT_PORT)}"
    if not endpoint:
        if nnodes > 1:
            raise InputError("--rdzv-endpoint", f"a launch on {nnodes} nodes needs the rendezvous HOST:PORT "
                                                "(flag, ATTUNE_RDZV_ENDPOINT or MASTER_ADDR)")
        endpoint = f"localhost:{DEFAULT_PORT}"
    run_id = run_id or os.environ.get("ATTUNE_RDZV_ID") or f"attune-{name}"
    return endpoint, run_id


def render_launch(recipe: Recipe, *, extra: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                  rdzv_endpoint: str | None = None, rdzv_id: str | None = None, log_dir: str | None = None) -> Launch:
    """The launch of `recipe` on its cluster; `extra` adds fields (trial settings) on top of [config].
    log_dir: torchrun's per-rank logs and error files (`--log-dir`); without it torchrun makes a
    /tmp/torchelastic_* folder per run and leaves it there."""
    cluster = recipe.cluster
    per_node = cluster.node_size
    nnodes = cluster.gpus // per_node
    targs = train_args(recipe, extra)
    base_env = dict(BASE_ENV)
    if on_cpu(recipe):   # cpu.py's memory monitor holds each process to the cluster's memory
        base_env["ATTUNE_CPU_MEMORY_LIMIT_GIB"] = f"{cluster.memory_gib:g}"
    if on_cpu(recipe) and nnodes == 1:
        # One machine's cores: each process gets its share, and a free port of its own.
        where = ["--standalone"]
        base_env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // per_node))
    else:
        endpoint, run_id = rendezvous(nnodes, rdzv_endpoint, rdzv_id, recipe.name)
        where = (["--rdzv-backend", "c10d"] + ([] if endpoint == RDZV_FROM_ENV else ["--rdzv-endpoint", endpoint])
                 + ["--rdzv-id", run_id])
    # Under pipeline parallelism only the last stage holds the loss: the last ranks for most
    # schedules (pp is the outermost mesh dimension), the first for V-shaped ones (ZBVZeroBubble).
    # Log a node's first and last local rank; the log parser keeps the line with the real loss.
    log_ranks = f"0,{per_node - 1}" if recipe.layout().pp > 1 and per_node > 1 else "0"
    argv = ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(per_node), *where,
            "--local-ranks-filter", log_ranks, "--role", "rank", "--tee", "3",
            *(["--log-dir", log_dir] if log_dir else []), "-m", "torchtitan.train", *targs]
    return Launch(argv=argv, env=base_env | dict(env or {}), train_args=targs,
                  nnodes=nnodes, nproc_per_node=per_node)
