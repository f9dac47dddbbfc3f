"""Rendered launches checked by torchtitan 0.3's own ConfigManager (in a subprocess), where
torchtitan is installed: every public recipe and lever move is accepted, invalid overrides are
refused with one line naming the problem. One batch for the module: the first parse costs seconds."""

from __future__ import annotations

import pytest
from conftest import REPO, assert_one_line_error

pytest.importorskip("torchtitan")

from attune.errors import InputError  # noqa: E402
from attune.layout import apply_levers  # noqa: E402
from attune.recipe import load_recipe  # noqa: E402
from attune.stacks.torchtitan.render import train_args  # noqa: E402
from attune.stacks.torchtitan.validate import one_line, validate_batch, validate_train_args  # noqa: E402

PUBLIC = sorted((REPO / "recipes" / "public").glob("*.toml"))


def _moved(name: str, moves: dict):
    recipe = load_recipe(REPO / "recipes" / "public" / f"{name}.toml")
    return recipe.with_config(apply_levers(recipe.config, moves, recipe.architecture, recipe.cluster))


VALID = {f"public:{p.stem}": train_args(load_recipe(p)) for p in PUBLIC} | {
    "8b ac none + compile": train_args(_moved("llama3_8b", {"activation_checkpoint.mode": "none",
                                                             "compile.enable": True})),
    "16b float8 + full ac": train_args(_moved("deepseek_v3_16b", {"quantize.float8": "rowwise",
                                                                  "activation_checkpoint.mode": "full"})),
    "8b pp2": train_args(_moved("llama3_8b", {"parallelism.pipeline_parallel_degree": 2, "training.local_batch_size": 2})),
    "405b float8 off, no compile": train_args(_moved("llama3_405b", {"quantize.float8": "none",
                                                                      "compile.enable": False})),
    "qwen3 ep8": train_args(_moved("qwen3_30b_a3b", {"parallelism.expert_parallel_degree": 8})),
}
INVALID = {
    "unknown field": (train_args(load_recipe(PUBLIC[0]), {"training.bogus": 2}), "training.bogus"),
    "wrong type": (train_args(load_recipe(REPO / "recipes/public/llama3_8b.toml"), {"training.steps": "ten"}),
                   "training.steps"),
    "tp does not divide heads": (["--module", "llama3", "--config", "llama3_8b",
                                  "--parallelism.tensor_parallel_degree", "3"], "tensor_parallel_degree"),
}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, str | None]:
    names = list(VALID) + list(INVALID)
    batch = list(VALID.values()) + [args for args, _needle in INVALID.values()]
    return dict(zip(names, validate_batch(batch)))


@pytest.mark.parametrize("name", list(VALID))
def test_torchtitan_accepts(verdicts, name):
    assert verdicts[name] is None, verdicts[name]


@pytest.mark.parametrize("name", list(INVALID))
def test_torchtitan_refuses_with_one_line(verdicts, name):
    error = verdicts[name]
    assert error and "\n" not in error and INVALID[name][1] in error, error


def test_tyro_box_becomes_one_line():
    box = (" Unrecognized options \n ----------- \n  Unrecognized options: --training.bogus, 2 \n"
           "  ----------- \n  For full helptext, run x --help \n")
    assert one_line(box) == "Unrecognized options: --training.bogus, 2"
    assert one_line("ValueError: plain text\nmore") == "ValueError: plain text"


@pytest.mark.slow
def test_validate_raises_input_error_and_cli_flag(cli):
    with pytest.raises(InputError, match="training.bogus"):
        validate_train_args(["--module", "llama3", "--config", "llama3_8b", "--training.bogus", "1"])
    proc = cli("trial", "render", REPO / "recipes/public/llama3_8b.toml", "--nnodes", "1", "--set", "training.bogus=1",
               "--validate", "--json")
    assert_one_line_error(proc, "training.bogus")


@pytest.mark.slow
def test_shipped_recipe_values_match_the_installed_wheel():
    from attune.stacks.torchtitan.recipe_values import load_values, wheel_values
    wheel = {f"{m}.{c}": v for m, configs in wheel_values().items() for c, v in configs.items()}
    assert wheel == load_values(), "regenerate: python -m attune.stacks.torchtitan.recipe_values --write"
