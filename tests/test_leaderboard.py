"""TrainingThroughputBench: rows, renderings, the CLI, the committed seed board and the seed script."""

from __future__ import annotations

import importlib.util
import json
from html.parser import HTMLParser
from pathlib import Path

from attune.cli.main import main
from attune.leaderboard import SEED_DIR, best_rows, load_board, render_html, render_json, render_md
from attune.store import open_store
from test_store import make_entry

REPO = Path(__file__).resolve().parent.parent

JSON_FIELDS = {"model", "accelerator", "gpus", "levers", "tokens_per_sec_per_gpu", "mfu", "cost_per_million_tokens",
               "gate_passed", "simulated", "stack", "measured_at", "mlflow_run_id"}


def sample_entries():
    other_stack = {"torch": "2.12.0", "torchtitan": "0.3.0"}
    return [
        (make_entry(8000), "store"),
        (make_entry(8500, stack=other_stack), "store"),                  # same model+cluster, other stack: best
        (make_entry(30000, verified=False), "store"),                     # unverified: never shown
        (make_entry(9500, gpus=64, simulated=False), "seed"),             # another cluster, on hardware
        (make_entry(3000, model="qwen3-30b-a3b", accelerator="h200"), "seed"),
    ]


def test_best_verified_row_per_model_and_cluster_sorted():
    rows = best_rows(sample_entries())
    assert [(r.model, r.cluster, r.tokens_per_sec_per_gpu, r.rank) for r in rows] == [
        ("llama3.1-8b", "h100:64", 9500.0, 1), ("llama3.1-8b", "h100:8", 8500.0, 2),
        ("qwen3-30b-a3b", "h200:8", 3000.0, 1)]
    assert all(r.gate_passed for r in rows)
    assert [r.measured_on for r in rows] == ["hardware", "simulator", "simulator"]
    assert [r.model for r in best_rows(sample_entries(), model="qwen3-30b-a3b")] == ["qwen3-30b-a3b"]


def test_renderings_label_simulated_rows(tmp_path):
    store = open_store(str(tmp_path))
    for entry, _ in sample_entries():
        store.put(entry)
    board = load_board(str(tmp_path), seed_dir=None)
    data = json.loads(render_json(board))
    assert len(data["rows"]) == 3 and all(JSON_FIELDS <= set(row) for row in data["rows"])
    md = render_md(board)
    table = [line for line in md.splitlines() if line.startswith("| ") and ("llama" in line or "qwen" in line)]
    assert len(table) == 3
    assert [("**simulated**" in line) for line in table] == [False, True, True]
    page = render_html(board)
    cells = _rows(page)
    assert len(cells) == 3
    assert [("simulated" in " ".join(row)) for row in cells] == [False, True, True]
    assert "<script>" in page and "src=" not in page and "<link" not in page  # one file, no CDN


def test_empty_board_renders_in_every_format(tmp_path):
    board = load_board(str(tmp_path / "none"), seed_dir=None)
    assert board.rows == []
    assert "No verified recipes yet" in render_md(board)
    assert json.loads(render_json(board))["rows"] == []
    assert "No verified recipes yet" in render_html(board)
    assert not (tmp_path / "none").exists()  # reading a store creates nothing


def test_cli_leaderboard_merges_seed_and_store_and_publishes(tmp_path, cli, monkeypatch, capsys):
    seed = open_store(str(tmp_path / "seed"))
    seed.put(make_entry(4000, model="qwen3-30b-a3b"))
    seed.put(make_entry(7000))
    open_store(str(tmp_path / ".attune" / "store")).put(make_entry(7500))  # the cli fixture's ATTUNE_HOME
    proc = cli("leaderboard", "--seed", tmp_path / "seed", "--format", "json", check=True)
    rows = json.loads(proc.stdout)["rows"]
    assert [(r["model"], r["tokens_per_sec_per_gpu"], r["source"]) for r in rows] == [
        ("llama3.1-8b", 7500.0, "store"), ("qwen3-30b-a3b", 4000.0, "seed")]
    # the rest in-process (one interpreter start-up is enough), same store through ATTUNE_HOME
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path / ".attune"))
    monkeypatch.delenv("ATTUNE_STORE", raising=False)
    assert main(["leaderboard", "--seed", str(tmp_path / "seed"), "--model", "qwen3-30b-a3b"]) == 0
    md = capsys.readouterr().out
    assert "qwen3-30b-a3b" in md and "llama3.1-8b" not in md and "**simulated**" in md
    assert main(["leaderboard", "publish", "--seed", str(tmp_path / "seed")]) == 0
    out = capsys.readouterr().out
    published = tmp_path / ".attune" / "store" / "leaderboard"
    assert sorted(p.name for p in published.iterdir()) == ["index.html", "leaderboard.json", "leaderboard.md"]
    assert str(published / "index.html") in out
    assert len(json.loads((published / "leaderboard.json").read_text())["rows"]) == 2


def test_committed_seed_board_is_a_valid_store_and_shows_on_a_fresh_clone(tmp_path, monkeypatch, capsys):
    assert SEED_DIR == REPO / "leaderboard"
    seed = open_store(str(SEED_DIR))
    entries = seed.list()  # every committed entry parses
    assert set(seed.index()["entries"]) == {e.key for e in entries}
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path / "fresh"))  # default seed, empty configured store
    monkeypatch.delenv("ATTUNE_STORE", raising=False)
    assert main(["leaderboard", "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"]) == len(best_rows([(e, "seed") for e in entries]))


def test_seed_script_runs_each_plan_entry_through_the_store(tmp_path):
    spec = importlib.util.spec_from_file_location("seed_leaderboard", REPO / "scripts" / "seed_leaderboard.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    runs = script.load_plan(script.PLAN)
    assert runs and all(Path(recipe).is_file() for recipe, _, _ in runs)
    calls = []

    def fake_campaign(recipe_path, cluster, budget):
        calls.append((recipe_path, cluster, budget))
        if "qwen3" in recipe_path:
            return None
        if "gpt_oss" in recipe_path:
            raise RuntimeError("campaign crashed")
        name, count = cluster.split(":")
        return make_entry(1000.0 + len(calls), accelerator=name, gpus=int(count),
                          model=Path(recipe_path).stem.replace("_", "-")).model_dump()

    store = open_store(str(tmp_path / "board"))
    report = script.seed(runs, store, fake_campaign)
    assert calls == runs
    outcomes = [row["outcome"] for row in report]
    nothing = sum("qwen3" in recipe for recipe, _, _ in runs)
    crashed = sum("gpt_oss" in recipe for recipe, _, _ in runs)
    assert nothing and crashed, "the plan should hold qwen3 and gpt_oss runs for this test"
    assert outcomes.count("nothing to record") == nothing and sum(o.startswith("failed") for o in outcomes) == crashed
    # entries are keyed by model and cluster: runs of one model on one cluster share a key
    stored = {(Path(r).stem, c) for (r, c, _), o in zip(runs, outcomes) if o == "stored"}
    assert len(store.list()) == len(stored) > 0
    assert script.main(["--dry-run", "--only", "mixtral"]) == 0


def _rows(page: str) -> list[list[str]]:
    """Text of each <tbody> row's cells."""
    class Rows(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.in_body = [], False

        def handle_starttag(self, tag, attrs):
            if tag == "tbody":
                self.in_body = True
            elif tag == "tr" and self.in_body:
                self.rows.append([])

        def handle_endtag(self, tag):
            if tag == "tbody":
                self.in_body = False

        def handle_data(self, data):
            if self.in_body and self.rows and data.strip():
                self.rows[-1].append(data.strip())

    parser = Rows()
    parser.feed(page)
    return parser.rows
