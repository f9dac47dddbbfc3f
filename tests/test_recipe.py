"""Recipe files: load, dump round trip, model spec files, and one-line errors for bad input."""

import json

from conftest import assert_one_line_error

from attune.recipe import dump_recipe, load_recipe, recipe_from_dict
import tomllib


def test_round_trip_keeps_every_field(write_recipe, tmp_path):
    recipe = load_recipe(write_recipe())
    again = tmp_path / "again.toml"
    again.write_text(dump_recipe(recipe))
    assert load_recipe(again) == recipe
    assert tomllib.loads(dump_recipe(recipe))["config"]["training.seq_len"] == 8192


def test_nested_config_tables_mean_the_same_dotted_keys(write_recipe):
    nested = write_recipe("""
        name = "x"
        model = "llama3.1-8b"
        [cluster]
        accelerator = "h100"
        gpus = 8
        [stack]
        torch = "2.13.0"
        torchtitan = "0.3.0"
        [config]
        training.local_batch_size = 2
        parallelism.tensor_parallel_degree = 2
        """, "nested.toml")
    assert load_recipe(nested).config == {"training.local_batch_size": 2, "parallelism.tensor_parallel_degree": 2}


def test_model_spec_file_replaces_the_catalog(write_recipe, tmp_path):
    spec = {"name": "tiny-moe", "n_layers": 4, "dim": 512, "n_heads": 8, "n_kv_heads": 4, "head_dim": 64,
            "ffn_dim": 1024, "vocab_size": 1000, "n_experts": 8, "top_k": 2, "moe_ffn_dim": 256,
            "n_shared_experts": 0, "n_dense_layers": 1}
    (tmp_path / "tiny.json").write_text(json.dumps(spec))
    path = write_recipe(open(write_recipe()).read().replace('model = "llama3.1-8b"', 'model_spec = "tiny.json"'))
    recipe = load_recipe(path)
    assert recipe.architecture.is_moe and recipe.model_name == "tiny-moe"


def test_cli_shows_resolved_layout(cli, write_recipe):
    proc = cli("recipe", "show", write_recipe(), "--set", "training.local_batch_size=1", "--json", check=True)
    layout = json.loads(proc.stdout)["layout"]
    assert layout["grad_accum"] == 2 and layout["global_batch"] == 16


def test_unknown_key_is_one_line_exit_2(cli, write_recipe):
    path = write_recipe(open(write_recipe()).read().replace("[stack]", "colour = 'red'\n[stack]"))
    assert_one_line_error(cli("recipe", "show", path), "cluster.colour", "unknown key")


def test_impossible_degree_is_one_line_exit_2(cli, write_recipe):
    # tp=3 does not divide the 8 GPUs: the error names the degree the user set, not the derived dp_shard
    assert_one_line_error(cli("recipe", "show", write_recipe(), "--set", "parallelism.tensor_parallel_degree=3"),
                          "tensor_parallel_degree")


def test_missing_file_and_missing_spec(cli, write_recipe):
    assert_one_line_error(cli("recipe", "show", "nope.toml"), "nope.toml", "not found")
    path = write_recipe(open(write_recipe()).read().replace('model = "llama3.1-8b"', 'model_spec = "missing.json"'))
    assert_one_line_error(cli("recipe", "show", path), "missing.json")


def test_bad_model_spec_names_the_key(cli, write_recipe, tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"name": "b", "n_layers": 2, "dim": 64, "n_heads": 6,
                                                   "n_kv_heads": 4, "head_dim": 8, "ffn_dim": 8, "vocab_size": 9}))
    path = write_recipe(open(write_recipe()).read().replace('model = "llama3.1-8b"', 'model_spec = "bad.json"'))
    assert_one_line_error(cli("recipe", "show", path), "n_kv_heads must divide n_heads")


def test_unknown_catalog_model():
    import pytest
    from attune.errors import InputError
    with pytest.raises(InputError) as err:
        recipe_from_dict({"name": "x", "model": "gpt-5", "cluster": {"accelerator": "h100", "gpus": 8},
                          "stack": {"torch": "2", "torchtitan": "0.3"}})
    assert "unknown catalog model" in err.value.rule
