"""Rendering recipes to torchtitan 0.3 launches: golden argv per public recipe, lever spellings,
companions torchtitan forces, and one-line errors. No torchtitan needed.

Regenerate the golden files after an intended change: ATTUNE_UPDATE_GOLDEN=1 pytest tests/test_torchtitan_render.py
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import REPO, assert_one_line_error

from attune.errors import InputError
from attune.layout import apply_levers
from attune.recipe import load_recipe
from attune.stacks.torchtitan.render import render_launch, train_args

PUBLIC = sorted((REPO / "recipes" / "public").glob("*.toml"))
GOLDEN = REPO / "tests" / "golden" / "torchtitan"
ENDPOINT = "head-node:29500"

# Lever moves whose launches are pinned too: (recipe, moves, golden name).
MOVES = [
    ("llama3_8b", {"activation_checkpoint.mode": "full", "parallelism.tensor_parallel_degree": 2}, "llama3_8b-ac_full-tp2"),
    # pp 2 needs 2 micro-batches under 1F1B (local batch 1 has one): local batch 2, so dp 32 at accumulation 1
    ("llama3_8b", {"parallelism.pipeline_parallel_degree": 2, "training.local_batch_size": 2, "compile.enable": True},
     "llama3_8b-pp2-local2-compile"),
    ("llama3_405b", {"quantize.float8": "none", "compile.enable": False}, "llama3_405b-no_float8-no_compile"),
    ("qwen3_30b_a3b", {"parallelism.expert_parallel_degree": 8, "quantize.float8": "rowwise"}, "qwen3_30b_a3b-ep8-float8"),
]


def _check_golden(name: str, payload: dict) -> None:
    path = GOLDEN / f"{name}.json"
    if os.environ.get("ATTUNE_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2) + "\n")
    assert path.is_file(), f"missing golden file {path} (ATTUNE_UPDATE_GOLDEN=1 writes it)"
    assert payload == json.loads(path.read_text()), f"launch of {name} differs from {path}"


@pytest.mark.parametrize("path", PUBLIC, ids=[p.stem for p in PUBLIC])
def test_public_recipe_renders_to_its_golden_launch(path, monkeypatch):
    for var in ("ATTUNE_RDZV_ENDPOINT", "MASTER_ADDR", "ATTUNE_RDZV_ID"):
        monkeypatch.delenv(var, raising=False)
    recipe = load_recipe(path)
    launch = render_launch(recipe, rdzv_endpoint=ENDPOINT)
    _check_golden(path.stem, launch.payload())
    # A public recipe is torchtitan's own: nothing to override.
    assert launch.train_args == ["--module", recipe.torchtitan.module, "--config", recipe.torchtitan.config]
    assert launch.argv[:2] == ["torchrun", "--nnodes"]
    assert launch.nnodes * launch.nproc_per_node == recipe.cluster.gpus


@pytest.mark.parametrize("name,moves,golden", MOVES, ids=[m[2] for m in MOVES])
def test_lever_moves_render_to_their_golden_launch(name, moves, golden, monkeypatch):
    monkeypatch.delenv("ATTUNE_RDZV_ENDPOINT", raising=False)
    recipe = load_recipe(REPO / "recipes" / "public" / f"{name}.toml")
    moved = recipe.with_config(apply_levers(recipe.config, moves, recipe.architecture, recipe.cluster))
    _check_golden(golden, render_launch(moved, rdzv_endpoint=ENDPOINT).payload())


def _recipe(name: str = "llama3_8b"):
    return load_recipe(REPO / "recipes" / "public" / f"{name}.toml")


def test_lever_spellings_of_torchtitan_0_3():
    args = train_args(_recipe(), {"activation_checkpoint.mode": "none", "compile.enable": True,
                                  "quantize.float8": "rowwise", "optimizer.lr": 1e-4, "debug.seed": 7})
    # tyro: booleans are flags, the AC policy is a subcommand that must come last
    assert args[-1] == "activation-checkpoint:none"
    assert "--compile.enable" in args and "True" not in args
    assert args[args.index("--optimizer.param_groups.0.optimizer_kwargs.lr") + 1] == "0.0001"  # alias of 0.2's name
    assert args[args.index("--override.imports") + 1] == (
        'attune.stacks.torchtitan.overrides.float8_linear={"recipe_name": "rowwise"}')
    assert train_args(_recipe(), {"compile.enable": False}) == ["--module", "llama3", "--config", "llama3_8b"]


def test_companions_torchtitan_forces():
    # PP (and EP from a non-EP recipe) need CUDA graphs off; async TP needs compile.
    assert "--training.disable_cuda_graphs" in train_args(_recipe(), {"parallelism.pipeline_parallel_degree": 2})
    off = train_args(_recipe("llama3_405b"), {"compile.enable": False})
    assert "--compile.no-enable" in off and "--compile.no-enable_async_tensor_parallel" in off
    assert "--training.disable_cuda_graphs" not in train_args(_recipe("deepseek_v3_16b"), {})  # already off there


def test_float8_off_for_a_float8_recipe_and_tensorwise_refused():
    args = train_args(_recipe("llama3_405b"), {"quantize.float8": "none"})
    assert args[args.index("--override.imports") + 1] == "attune.stacks.torchtitan.overrides.float8_linear_off"
    with pytest.raises(InputError, match="tensorwise"):
        train_args(_recipe("llama3_405b"), {"quantize.float8": "tensorwise"})


def test_multi_node_needs_a_rendezvous_endpoint(monkeypatch):
    for var in ("ATTUNE_RDZV_ENDPOINT", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(InputError, match="rdzv-endpoint"):
        render_launch(_recipe("llama3_405b"))
    monkeypatch.setenv("MASTER_ADDR", "node-0")
    assert "node-0:29500" in render_launch(_recipe("llama3_405b")).argv
    assert "--rdzv-endpoint" not in render_launch(_recipe("llama3_405b"), rdzv_endpoint="env").argv


def test_cli_render_json_with_set_and_nnodes(cli):
    proc = cli("trial", "render", REPO / "recipes/public/llama3_8b.toml", "--set", "activation_checkpoint.mode=full",
               "--nnodes", "1", "--json", check=True)
    payload = json.loads(proc.stdout)
    assert set(payload) == {"argv", "env"}
    argv = payload["argv"]
    assert argv[argv.index("--nnodes") + 1] == "1" and argv[argv.index("--nproc-per-node") + 1] == "8"
    assert argv[-1] == "activation-checkpoint:full"
    assert argv[argv.index("-m") + 1] == "torchtitan.train"
    assert payload["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_cli_render_errors_are_one_line(cli):
    proc = cli("trial", "render", REPO / "recipes/public/llama3_405b.toml", "--rdzv-endpoint", ENDPOINT,
               "--set", "quantize.float8=tensorwise", "--json")
    assert_one_line_error(proc, "quantize.float8", "tensorwise")
    assert_one_line_error(cli("trial", "render", REPO / "recipes/public/llama3_8b.toml", "--nnodes", "0"), "--nnodes")
