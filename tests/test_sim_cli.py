"""`attune sim predict` / `attune sim oracle`: valid JSON for every public recipe, one-line errors."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest

from attune.cli.main import main
from tests.conftest import RECIPE_8B, assert_one_line_error

PUBLIC = sorted((Path(__file__).resolve().parent.parent / "recipes" / "public").glob("*.toml"))

# Used only where recipes/public/ is empty: a dense and an MoE recipe in the same shape.
FALLBACK = {
    "dense.toml": RECIPE_8B,
    "moe.toml": RECIPE_8B.replace('model = "llama3.1-8b"', 'model = "qwen3-30b-a3b"')
                         .replace('"training.local_batch_size" = 2', '"training.local_batch_size" = 1\n'
                                  '"parallelism.expert_parallel_degree" = 8'),
}


@pytest.fixture(scope="module")
def recipes(tmp_path_factory) -> list[Path]:
    if PUBLIC:
        return PUBLIC
    folder = tmp_path_factory.mktemp("recipes")
    for name, text in FALLBACK.items():
        (folder / name).write_text(text)
    return sorted(folder.glob("*.toml"))


def run(*argv: str) -> tuple[int, str, str]:
    """The CLI in this process (subprocesses would cost a second each)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:        # argparse errors
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _check_predict(payload: dict) -> None:
    assert set(payload) == {"fits", "peak_memory_gib", "step_time_s", "tokens_per_sec_per_gpu", "mfu", "breakdown",
                            "simulated", "source"}
    assert payload["simulated"] is True and isinstance(payload["fits"], bool)
    assert payload["step_time_s"] > 0 and payload["tokens_per_sec_per_gpu"] > 0 and 0 < payload["mfu"] < 1.5
    assert {"compute_s", "exposed_comm_s", "memory_gib", "hbm_gib"} <= set(payload["breakdown"])


@pytest.mark.parametrize("cluster", ["h100:8", "h100:64", "h200:256"])
def test_predict_answers_json_for_every_public_recipe(recipes, cluster):
    for path in recipes:
        for extra in ([], ["--estimator"]):
            code, out, err = run("sim", "predict", path, "--cluster", cluster, "--json", *extra)
            assert code == 0, (path.name, err)
            payload = json.loads(out)
            _check_predict(payload)
            assert payload["source"] == ("estimator" if extra else "ground_truth")


def _check_oracle(payload: dict) -> None:
    assert payload["simulated"] is True and payload["evaluated"] > 0 and payload["seconds"] >= 0
    if payload["best"] is not None:
        assert payload["best"]["tokens_per_sec_per_gpu"] > 0
        assert "parallelism.tensor_parallel_degree" in payload["best"]["levers"]


def test_oracle_answers_json_for_every_public_recipe_on_8_gpus(recipes):
    for path in recipes:
        code, out, err = run("sim", "oracle", path, "--cluster", "h100:8", "--json")
        assert code == 0, (path.name, err)
        _check_oracle(json.loads(out))


@pytest.mark.slow
@pytest.mark.parametrize("cluster", ["h100:64", "h200:256"])
def test_oracle_answers_json_for_every_public_recipe_at_scale(recipes, cluster):
    for path in recipes:
        code, out, err = run("sim", "oracle", path, "--cluster", cluster, "--json")
        assert code == 0, (path.name, err)
        payload = json.loads(out)
        _check_oracle(payload)
        assert payload["seconds"] < 10


def test_predict_noise_follows_the_seed_and_the_estimator_has_none(write_recipe):
    path = write_recipe()
    tps = lambda *a: json.loads(run("sim", "predict", path, "--json", *a)[1])["tokens_per_sec_per_gpu"]  # noqa: E731
    assert tps("--seed", "1") == tps("--seed", "1") != tps("--seed", "2")
    assert tps("--estimator", "--seed", "1") == tps("--estimator", "--seed", "2")
    assert tps("--cluster-seed", "3") != tps("--cluster-seed", "4")


def test_human_output_is_a_short_table_and_a_one_line_oracle_summary(write_recipe):
    path = write_recipe()
    code, out, _ = run("sim", "predict", path, "--set", "compile.enable=true")
    assert code == 0 and "simulated" in out and "tokens/s/GPU" in out and len(out.splitlines()) <= 12
    code, out, _ = run("sim", "oracle", path)
    last = out.strip().splitlines()[-1]
    assert code == 0 and last.startswith("oracle: best") and "simulated" in last and "layouts evaluated" in last


@pytest.mark.parametrize("argv, needle", [
    (["--cluster", "x100:8"], "accelerator"),
    (["--cluster", "h100:12"], "--cluster"),
    (["--set", "parallelism.tensor_parallel_degree=3"], "parallelism"),
    (["--seed", "-1"], "--seed"),
    (["--model-spec", "missing.json"], "missing.json"),
])
def test_bad_input_exits_2_with_one_line(write_recipe, argv, needle):
    code, out, err = run("sim", "predict", write_recipe(), *argv)
    assert_one_line_error(subprocess.CompletedProcess([], code, out, err), needle)


def test_the_installed_entry_point_gives_one_line_errors_too(cli):
    assert_one_line_error(cli("sim", "oracle", "nope.toml", "--json"), "nope.toml")
