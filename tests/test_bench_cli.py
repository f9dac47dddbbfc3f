"""`attune bench` as a user runs it: bad requests are refused up front; a small benchmark end to end."""

from __future__ import annotations

import json
import sqlite3

import pytest
from conftest import REPO, assert_one_line_error

PUBLIC_8B = REPO / "recipes" / "public" / "llama3_8b.toml"


@pytest.mark.parametrize("args, needle", [
    (["--planners", "attune,nope"], "--planners"),
    (["--disable-rule", "nope"], "--disable-rule"),
    (["--budget-gpu-hours", "-1"], "--budget-gpu-hours"),
    (["--seeds", "0"], "--seeds"),
    (["--steps", "0"], "--steps: Input should be greater than or equal to 1, got 0"),
    (["--gate-steps", "1"], "--gate-steps"),
])
def test_bad_bench_requests_exit_2_before_any_campaign(cli, tmp_path, args, needle):
    assert_one_line_error(cli("bench", "--recipes", PUBLIC_8B, *args, "--out", tmp_path / "out"), needle)
    assert not (tmp_path / "out").exists()


def test_a_missing_recipe_is_named(cli, tmp_path):
    assert_one_line_error(cli("bench", "--recipes", tmp_path / "nope.toml"), "nope.toml")


@pytest.mark.slow
def test_bench_end_to_end_json_plots_and_mlflow(cli, tmp_path):
    # a model spec file the project has never seen, given as a recipe's model (the path a user takes)
    spec = tmp_path / "tiny_moe.toml"
    spec.write_text('name = "tiny-moe"\nn_layers = 16\ndim = 2048\nn_heads = 16\nn_kv_heads = 4\nhead_dim = 128\n'
                    'ffn_dim = 5632\nvocab_size = 32000\nn_experts = 16\ntop_k = 2\nmoe_ffn_dim = 1408\n'
                    'n_dense_layers = 1\n')
    out = tmp_path / "bench"
    proc = cli("bench", "--recipes", PUBLIC_8B, "--model-spec", spec, "--planners", "random,estimator-topk",
               "--seeds", "1", "--budget-gpu-hours", "12", "--out", out, "--json", check=True, timeout=900)
    payload = json.loads(proc.stdout)
    rows = payload["results"]
    assert {r["planner"] for r in rows} == {"random", "estimator-topk"} and payload["simulated"] is True
    for row in rows:
        for key in ("recipe", "planner", "mean_gain", "best_gain", "ci95", "oracle_share", "gpu_hours_used",
                    "gpu_hours_to_95", "gate_pass_rate", "payback_hours"):
            assert key in row, key
        assert row["gpu_hours_used"] <= 12.0 and 0 < row["oracle_share"] <= 1.0 + 1e-6
    md = (out / "results.md").read_text()
    assert all(md.count(f"| {rows[0]['recipe']} | {planner} |") == 1 for planner in ("random", "estimator-topk"))
    assert (out / "bench.png").stat().st_size > 10_000
    db = sqlite3.connect(tmp_path / ".attune" / "mlflow.db")
    names = {n for (n,) in db.execute("select name from experiments")}
    assert "attune-bench" in names
