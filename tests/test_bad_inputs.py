"""Bad input, table-driven: every case is refused with exit code 2 and ONE line on stderr that names
the field, before anything is written (no campaign folder under $ATTUNE_HOME, no file elsewhere).

Most cases run `attune.cli.main.main([...])` in this process (a CLI subprocess costs ~2 s of
imports each) with the Prefect flows replaced by a stub that fails the test: a refusal must come
before a flow starts. A handful run through the real CLI subprocess, the path escape among them.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import RECIPE_8B, RECIPE_8B_H100, assert_one_line_error

ONE_MIB = 1 << 20
SPEC = {"name": "tiny-dense", "n_layers": 4, "dim": 512, "n_heads": 8, "n_kv_heads": 4, "head_dim": 64,
        "ffn_dim": 1024, "vocab_size": 1000}


def swap(old: str, new: str, text: str = RECIPE_8B) -> str:
    """The recipe text with one line replaced (the line must be there: a typo fails loudly)."""
    assert old in text, old
    return text.replace(old, new, 1)


def with_config(line: str, text: str = RECIPE_8B) -> str:
    return text + line + "\n"


@dataclass(frozen=True)
class Bad:
    id: str
    args: tuple[str, ...]                 # {recipe} is the recipe file, {tmp} the test's folder
    needles: tuple[str, ...]              # what the one line must contain: the field, and the rule
    recipe: str | bytes | None = RECIPE_8B
    files: dict[str, str | bytes] = field(default_factory=dict)
    subprocess: bool = False              # through the real CLI (else main() in this process)


def tune(*extra: str) -> tuple[str, ...]:
    return ("tune", "{recipe}", "--budget-gpu-hours", "5", *extra)


CASES = [
    # -- the recipe's name: it becomes a folder name, an MLflow tag and a store key part
    Bad("name-path-escape", tune(), ("name", "../"), swap('name = "llama3_8b-test"',
        'name = "../../../escape"'), subprocess=True),
    Bad("name-slash", tune(), ("name",), swap('name = "llama3_8b-test"', 'name = "team/llama"')),
    Bad("name-empty", tune(), ("name",), swap('name = "llama3_8b-test"', 'name = ""')),
    Bad("name-too-long", tune(), ("name", "128"), swap('name = "llama3_8b-test"', f'name = "{"x" * 300}"')),
    Bad("name-unicode", tune(), ("name",), swap('name = "llama3_8b-test"', 'name = "llama-тест"')),
    Bad("name-hidden-dot", tune(), ("name",), swap('name = "llama3_8b-test"', 'name = ".hidden"')),
    Bad("name-newline", tune(), ("name",), swap('name = "llama3_8b-test"', 'name = "ok\\n"')),
    Bad("name-dotdot-inside", tune(), ("name", ".."), swap('name = "llama3_8b-test"', 'name = "a..b"')),
    Bad("name-not-a-string", tune(), ("name",), swap('name = "llama3_8b-test"', "name = 7")),
    # -- the recipe file itself
    Bad("recipe-missing", tune(), ("nope.toml", "not found"), None, ),
    Bad("recipe-directory", ("tune", "{tmp}/adir", "--budget-gpu-hours", "5"), ("adir", "directory"),
        files={"adir/x.txt": "x"}),
    Bad("recipe-binary", tune(), ("recipe.toml", "UTF-8"), bytes(range(256)) * 4, subprocess=True),
    Bad("recipe-latin1-name", tune(), ("recipe.toml", "UTF-8"),
        swap('name = "llama3_8b-test"', 'name = "caf\xe9"').encode("latin-1")),
    Bad("recipe-nul-byte", tune(), ("recipe.toml",), swap('torch = "2.13.0"', 'torch = "2.13.0\x00"')),
    Bad("recipe-over-1mib", tune(), ("recipe.toml", "MiB"), "# padding\n" * (ONE_MIB // 10 + 1) + RECIPE_8B),
    Bad("recipe-empty", tune(), ("name", "required"), ""),
    Bad("recipe-not-toml", tune(), ("recipe.toml", "TOML"), "name = \n[[["),
    Bad("recipe-top-level-unknown", tune(), ("colour", "unknown key"), "colour = 'red'\n" + RECIPE_8B),
    # -- [cluster]
    Bad("cluster-missing", tune(), ("cluster", "required"), RECIPE_8B.replace(
        '[cluster]\naccelerator = "h100"\ngpus = 8\n', "")),
    Bad("accelerator-unknown", tune(), ("cluster.accelerator", "h900"), swap('"h100"', '"h900"')),
    Bad("gpus-zero", tune(), ("cluster.gpus",), swap("gpus = 8", "gpus = 0")),
    Bad("gpus-negative", tune(), ("cluster.gpus",), swap("gpus = 8", "gpus = -8")),
    Bad("gpus-absurd", tune(), ("cluster.gpus", "1048576"), swap("gpus = 8", "gpus = 1_000_000_000")),
    Bad("gpus-float", tune(), ("cluster.gpus", "integer"), swap("gpus = 64", "gpus = 64.0", RECIPE_8B_H100)),
    Bad("gpus-float-exponent", tune(), ("cluster.gpus", "integer"), swap("gpus = 8", "gpus = 1e9")),
    Bad("gpus-string", tune(), ("cluster.gpus", "integer"), swap("gpus = 8", 'gpus = "64"')),
    Bad("gpus-boolean", tune(), ("cluster.gpus", "integer"), swap("gpus = 8", "gpus = true")),
    Bad("gpus-not-whole-nodes", tune(), ("cluster", "gpus_per_node"), swap("gpus = 8", "gpus = 12")),
    Bad("hbm-infinite", tune(), ("cluster.hbm_gib", "finite"), swap("gpus = 8", "gpus = 8\nhbm_gib = inf")),
    Bad("price-nan", tune(), ("cluster.price_per_gpu_hour", "finite"),
        swap("gpus = 8", "gpus = 8\nprice_per_gpu_hour = nan")),
    Bad("stack-missing-torch", tune(), ("stack.torch", "required"), swap('torch = "2.13.0"\n', "")),
    # -- the model
    Bad("model-unknown", tune(), ("model", "gpt-5"), swap('"llama3.1-8b"', '"gpt-5"')),
    Bad("model-and-spec", tune(), ("model_spec",), swap('model = "llama3.1-8b"',
        'model = "llama3.1-8b"\nmodel_spec = "spec.json"'), files={"spec.json": json.dumps(SPEC)}),
    Bad("model-spec-file-missing", tune(), ("gone.json", "not found"),
        swap('model = "llama3.1-8b"', 'model_spec = "gone.json"')),
    Bad("model-spec-malformed", tune(), ("spec.json", "JSON"),
        swap('model = "llama3.1-8b"', 'model_spec = "spec.json"'), files={"spec.json": "{not json"}),
    Bad("model-spec-directory", tune(), ("specs", "directory"),
        swap('model = "llama3.1-8b"', 'model_spec = "specs"'), files={"specs/x.json": "{}"}),
    Bad("model-spec-binary", tune(), ("spec.json", "UTF-8"),
        swap('model = "llama3.1-8b"', 'model_spec = "spec.json"'), files={"spec.json": b"\xff\xfe\x00\x81" * 64}),
    Bad("model-spec-name-escape", tune(), ("spec.json", "name"),
        swap('model = "llama3.1-8b"', 'model_spec = "spec.json"'),
        files={"spec.json": json.dumps(SPEC | {"name": "../../evil"})}),
    Bad("model-spec-not-an-object", tune(), ("spec.json", "object"),
        swap('model = "llama3.1-8b"', 'model_spec = "spec.json"'), files={"spec.json": "[1, 2]"}),
    Bad("flag-model-spec-missing", tune("--model-spec", "{tmp}/none.json"), ("none.json", "not found")),
    Bad("flag-model-spec-directory", tune("--model-spec", "{tmp}/specs"), ("specs", "directory"),
        files={"specs/x.json": "{}"}),
    # -- [config]
    Bad("config-unknown-key", tune(), ("config.parallelism.warp_drive_degree", "unknown"),
        with_config('"parallelism.warp_drive_degree" = 2')),
    Bad("config-unknown-nested", tune(), ("config.training.sequence_len", "training.seq_len"),
        with_config("training.sequence_len = 4096")),
    Bad("config-list-value", tune(), ("config.training.seq_len", "scalar"),
        swap('"training.seq_len" = 8192', '"training.seq_len" = [8192]')),
    Bad("config-nan", tune(), ("optimizer.lr", "finite"), swap('"optimizer.lr" = 3e-4', '"optimizer.lr" = nan')),
    Bad("tp-does-not-divide-world", tune(), ("tensor_parallel_degree", "64"),
        with_config('"parallelism.tensor_parallel_degree" = 3', RECIPE_8B_H100)),
    Bad("pp-does-not-divide-world", tune(), ("pipeline_parallel_degree", "64"),
        with_config('"parallelism.pipeline_parallel_degree" = 6', RECIPE_8B_H100)),
    Bad("degree-boolean", tune(), ("tensor_parallel_degree", "integer"),
        with_config('"parallelism.tensor_parallel_degree" = true')),
    Bad("degree-string", tune(), ("tensor_parallel_degree", "integer"),
        with_config('"parallelism.tensor_parallel_degree" = "2"')),
    Bad("degree-zero", tune(), ("tensor_parallel_degree",), with_config('"parallelism.tensor_parallel_degree" = 0')),
    Bad("seq-len-huge", tune(), ("training.seq_len",), swap('"training.seq_len" = 8192',
        '"training.seq_len" = 1_000_000_000_000')),
    Bad("choice-unknown", tune(), ("activation_checkpoint.mode", "selective"),
        swap('"activation_checkpoint.mode" = "selective"', '"activation_checkpoint.mode" = "some"')),
    # -- attune tune's flags
    Bad("budget-infinite", tune("--budget-gpu-hours", "inf", "--json"), ("--budget-gpu-hours", "finite")),
    Bad("budget-nan", tune("--budget-gpu-hours", "nan"), ("--budget-gpu-hours", "finite")),
    Bad("budget-negative", tune("--budget-gpu-hours", "-1"), ("--budget-gpu-hours",)),
    Bad("cluster-unknown-accelerator", tune("--cluster", "h900:8"), ("--cluster", "h900")),
    Bad("cluster-count-not-a-number", tune("--cluster", "h100:abc"), ("--cluster", "abc")),
    Bad("cluster-count-negative", tune("--cluster", "h100:-8"), ("--cluster", "-8")),
    Bad("cluster-count-zero", tune("--cluster", "h100:0"), ("--cluster", "'0'")),
    Bad("cluster-count-absurd", tune("--cluster", "h100:99999999999"), ("--cluster", "1048576")),
    Bad("cluster-no-accelerator", tune("--cluster", ":8"), ("--cluster", "unknown accelerator")),
    Bad("steps-zero", tune("--steps", "0"), ("--steps",)),
    Bad("steps-huge", tune("--steps", "1000000000"), ("--steps",)),
    Bad("replicates-negative", tune("--replicates", "-2"), ("--replicates",)),
    Bad("replicates-huge", tune("--replicates", "100000"), ("--replicates",)),
    Bad("max-trials-zero", tune("--max-trials", "0"), ("--max-trials",)),
    Bad("max-trials-huge", tune("--max-trials", "10000000000"), ("--max-trials",)),
    Bad("seed-negative", tune("--seed", "-1"), ("--seed",)),
    Bad("seed-huge", tune("--seed", str(2 ** 70)), ("--seed",)),
    Bad("gate-steps-one", tune("--gate-steps", "1"), ("--gate-steps",)),
    Bad("stack-unknown", tune("--stack", "warp"), ("--stack", "warp")),
    Bad("planner-unknown", tune("--planner", "oracle"), ("--planner", "oracle")),
    Bad("out-is-a-directory", tune("--out", "{tmp}/outdir"), ("--out", "directory"), files={"outdir/keep": ""}),
    Bad("out-in-missing-folder", tune("--out", "{tmp}/no/such/folder/shipped.toml"), ("--out", "does not exist")),
    Bad("store-bad-scheme", tune("--store", "ftp://host/recipes"), ("--store", "ftp://")),
    Bad("store-s3-no-bucket", tune("--store", "s3://"), ("--store", "s3://BUCKET")),
    Bad("mlflow-uri-nonsense", tune("--mlflow-uri", "nonsense"), ("--mlflow-uri",)),
    Bad("mlflow-uri-bad-scheme", tune("--mlflow-uri", "gopher://x"), ("--mlflow-uri", "gopher")),
    # -- other commands that read recipes and flags
    Bad("set-unknown-key", ("recipe", "show", "{recipe}", "--set", "parallelism.warp_drive_degree=2"),
        ("parallelism.warp_drive_degree", "unknown")),
    Bad("set-bad-value", ("recipe", "show", "{recipe}", "--set", "parallelism.tensor_parallel_degree=abc"),
        ("tensor_parallel_degree", "integer")),
    Bad("set-no-equals", ("recipe", "show", "{recipe}", "--set", "training.seq_len"), ("--set", "key=value")),
    Bad("set-nan", ("recipe", "show", "{recipe}", "--set", "optimizer.lr=nan"), ("optimizer.lr", "finite")),
    Bad("show-cluster-absurd", ("recipe", "show", "{recipe}", "--cluster", "h100:4194304"),
        ("--cluster", "1048576")),
    Bad("bench-budget-infinite", ("bench", "--recipes", "{recipe}", "--budget-gpu-hours", "inf"),
        ("--budget-gpu-hours", "finite")),
    Bad("bench-budget-nan", ("bench", "--recipes", "{recipe}", "--budget-gpu-hours", "nan"),
        ("--budget-gpu-hours", "finite")),
    Bad("bench-seeds-huge", ("bench", "--recipes", "{recipe}", "--seeds", "1000000000"), ("--seeds", "1000")),
    Bad("bench-gate-seed-huge", ("bench", "--recipes", "{recipe}", "--gate-seed", str(2 ** 40)), ("--gate-seed",)),
    Bad("bench-mlflow-uri-nonsense", ("bench", "--recipes", "{recipe}", "--mlflow-uri", "nonsense"),
        ("--mlflow-uri",)),
    Bad("gate-baseline-directory", ("gate", "check", "--baseline", "{tmp}/adir", "--candidate", "{recipe}"),
        ("adir", "directory"), files={"adir/x.txt": "x"}),
    Bad("sim-binary-recipe", ("sim", "predict", "{recipe}"), ("recipe.toml", "UTF-8"), b"\x80\x81\x82" * 10),
    # -- a few more through the real CLI: the one line is what a user sees
    Bad("subprocess-unknown-config-key", tune(), ("config.parallelism.warp_drive_degree",),
        with_config('"parallelism.warp_drive_degree" = 2'), subprocess=True),
    Bad("subprocess-budget-infinite", tune("--budget-gpu-hours", "inf", "--json"), ("--budget-gpu-hours",),
        subprocess=True),
    Bad("subprocess-tp-does-not-divide", tune(), ("tensor_parallel_degree",),
        with_config('"parallelism.tensor_parallel_degree" = 3', RECIPE_8B_H100), subprocess=True),
]


class FlowStarted(AssertionError):
    """A bad input reached a Prefect flow: it must be refused before one starts."""


@pytest.fixture
def in_process(tmp_path, monkeypatch, capsys):
    """run(*args) -> CompletedProcess of attune.cli.main.main(args) in this process, flows stubbed out."""
    import attune.flows.bench
    import attune.flows.campaign
    from attune.cli.main import main

    def started(*_a, **_k):
        raise FlowStarted("a flow started")

    monkeypatch.setattr(attune.flows.campaign, "tune_campaign", started)
    monkeypatch.setattr(attune.flows.bench, "tuner_benchmark", started)
    saved = dict(os.environ)   # the commands set Prefect's defaults in os.environ
    monkeypatch.chdir(tmp_path)
    os.environ.update(ATTUNE_HOME=str(tmp_path / ".attune"), PREFECT_HOME=str(tmp_path / ".prefect"))

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as stop:   # argparse's own refusals
            code = stop.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    yield run
    os.environ.clear()
    os.environ.update(saved)


def _write(root: Path, name: str, content: str | bytes) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case: Bad, tmp_path, cli, in_process):
    work = tmp_path / "work"   # the test's files; ATTUNE_HOME and PREFECT_HOME are beside it
    work.mkdir()
    if case.recipe is not None:
        _write(work, "recipe.toml", case.recipe)
    for name, content in case.files.items():
        _write(work, name, content)
    recipe = work / ("recipe.toml" if case.recipe is not None else "nope.toml")
    args = [a.replace("{recipe}", str(recipe)).replace("{tmp}", str(work)) for a in case.args]
    before = _tree(tmp_path)

    proc = cli(*args, timeout=120) if case.subprocess else in_process(*args)

    assert_one_line_error(proc, *case.needles)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("attune: error: "), proc.stderr
    assert proc.stdout == "", proc.stdout
    written = {p for p in _tree(tmp_path) - before if not p.startswith(".prefect")}
    assert not written, sorted(written)   # no campaign folder, no shipped recipe, no store, nothing else


def test_path_escape_leaves_no_folder_outside_attune_home(tmp_path, in_process):
    """The name that escaped ATTUNE_HOME before: nothing appears above the test's folder either."""
    target = tmp_path.parent / "escaped-by-attune"
    recipe = tmp_path / "r.toml"
    recipe.write_text(swap('name = "llama3_8b-test"', f'name = "../../../{target.name}"'))
    assert_one_line_error(in_process("tune", str(recipe), "--budget-gpu-hours", "5"), "name")
    assert not list(tmp_path.parent.glob(f"{target.name}*"))


def test_unknown_config_key_suggests_the_nearest_known_one(tmp_path, in_process):
    recipe = tmp_path / "r.toml"
    recipe.write_text(with_config('"parallelism.tensor_paralel_degree" = 2'))
    proc = in_process("recipe", "show", str(recipe))
    assert_one_line_error(proc, "config.parallelism.tensor_paralel_degree",
                          "did you mean parallelism.tensor_parallel_degree")


def test_case_count():
    assert len(CASES) >= 43


def test_known_config_keys_cover_every_key_attune_reads_and_ships():
    """The keys ATTUNE renders, classifies or aliases, and every shipped recipe's, are known keys."""
    import tomllib

    from attune.levers import config_keys
    from attune.recipe import _flatten
    from attune.stacks.torchtitan.config_keys import attune_keys
    from conftest import REPO

    assert attune_keys() <= config_keys()
    for path in [*REPO.glob("recipes/**/*.toml"), *REPO.glob("benchmarks/recipes/*.toml")]:
        keys = set(_flatten(tomllib.loads(path.read_text()).get("config", {})))
        assert keys <= config_keys(), (path, keys - config_keys())


@pytest.mark.slow
def test_shipped_config_keys_match_the_installed_wheel():
    pytest.importorskip("torchtitan")
    from attune.data_files import load_data
    from attune.stacks.torchtitan.config_keys import all_keys
    assert all_keys() == load_data("config_keys")["keys"], \
        "regenerate: python -m attune.stacks.torchtitan.config_keys --write"


def test_leaderboard_html_escapes_everything_it_renders_from_data():
    """Store entries refuse unsafe model names, but the page must not trust its data either: every
    text field reaches the HTML through html.escape."""
    from attune.leaderboard import render_html
    from attune.leaderboard.rows import Board, BoardRow

    evil = '<script>alert("x")</script>'
    row = BoardRow(rank=1, model=evil, accelerator=evil, gpus=8, gpus_per_node=8, cluster=evil,
                   levers={evil: evil}, tokens_per_sec_per_gpu=1.0, mfu=None, step_time_s=None,
                   peak_memory_gib=None, cost_per_million_tokens=1.0, gate_passed=True, simulated=True,
                   measured_on="simulator", stack={evil: evil}, stack_fingerprint=evil, measured_at=evil,
                   mlflow_run_id=evil, source="store")
    page = render_html(Board(title=evil, generated_at=evil, sources=[evil], rows=[row]))
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page


@pytest.mark.parametrize("name", ["Llama-3.1_8b.v2", "x" * 128, "7b", "llama3_8b-test-attune"])
def test_names_inside_the_rule_still_load(write_recipe, name):
    from attune.recipe import load_recipe
    assert load_recipe(write_recipe(swap('name = "llama3_8b-test"', f'name = "{name}"'))).name == name
