"""The recipe store on the folder back end: entries, the keep-the-better rule, atomic writes,
concurrent writers in separate processes."""

from __future__ import annotations

import json
import multiprocessing
import tomllib
from pathlib import Path

import pytest

from attune.errors import InputError
from attune.recipe import load_recipe
from attune.store import (StoreEntry, StoreError, cost_per_million_tokens, default_store_uri, entry_for_recipe,
                          open_store, rank, store_location)
from attune.store.local import LocalBlobs
from attune.store.s3 import S3Blobs

STACK = {"torch": "2.13.0", "torchtitan": "0.3.0"}


def make_entry(tps: float = 8000.0, verified: bool = True, simulated: bool = True, **fields) -> StoreEntry:
    base = dict(model="llama3.1-8b", accelerator="h100", gpus=8, stack=STACK, recipe_toml='name = "r"\n',
                levers={"parallelism.tensor_parallel_degree": 1}, tokens_per_sec_per_gpu=tps, mfu=0.41,
                step_time_s=4.2, peak_memory_gib=61.0, gate_passed=verified,
                gate_report={"passed": verified}, mlflow_run_id=f"run-{tps:.0f}", simulated=simulated,
                measured_at="2026-11-30T12:00:00+00:00")
    return StoreEntry(**(base | fields))


def test_cost_per_million_tokens_uses_the_price_list_and_overrides(tmp_path, monkeypatch):
    # h100 lists at 2.99 USD/GPU-h: 8 GPUs x 1000 tok/s/GPU = 28.8 M tok/h for 23.92 USD/h
    assert cost_per_million_tokens("h100", 8, 1000.0) == pytest.approx(2.99 * 8 / (1000 * 8 * 3600) * 1e6)
    assert cost_per_million_tokens("h100", 8, 1000.0, price_per_gpu_hour=1.0) == pytest.approx(1e6 / 3.6e6)
    prices = tmp_path / "prices.toml"
    prices.write_text("[prices]\nh100 = 5.0\n")
    monkeypatch.setenv("ATTUNE_PRICES", str(prices))
    assert cost_per_million_tokens("h100", 64, 1000.0) == pytest.approx(5.0 / 3600 * 1e3)
    with pytest.raises(ValueError, match="positive"):
        cost_per_million_tokens("h100", 8, 0.0)


def test_entry_derives_fingerprint_and_cost_and_refuses_bad_fields():
    entry = make_entry()
    assert entry.stack_fingerprint and len(entry.stack_fingerprint) == 12
    assert entry.cost_per_million_tokens == pytest.approx(cost_per_million_tokens("h100", 8, 8000.0))
    assert entry.key == f"recipes/llama3.1-8b/h100x8/{entry.stack_fingerprint}/entry.json"
    assert entry.cluster_label == "h100:8"
    for bad, needle in [({"stack_fingerprint": "000000000000"}, "does not match"),
                        ({"accelerator": "tpu9"}, "unknown accelerator"), ({"model": "../etc"}, "must be letters"),
                        ({"mfu": 41.0}, "less than or equal"), ({"measured_at": "yesterday"}, "ISO 8601"),
                        ({"typo_field": 1}, "Extra inputs")]:
        with pytest.raises(ValueError, match=needle):
            make_entry(**bad)


def test_entry_for_recipe_takes_model_cluster_stack_and_levers_from_the_recipe(write_recipe):
    recipe = load_recipe(write_recipe())
    entry = entry_for_recipe(recipe, tokens_per_sec_per_gpu=7000.0, gate_passed=True, simulated=True,
                             mfu=0.4, mlflow_run_id="abc")
    assert (entry.model, entry.accelerator, entry.gpus) == ("llama3.1-8b", "h100", 8)
    assert entry.stack_fingerprint == recipe.stack.fingerprint()
    assert tomllib.loads(entry.recipe_toml)["name"] == "llama3_8b-test"
    assert "training.seq_len" not in entry.levers  # an objective setting, not a lever
    assert entry.levers["activation_checkpoint.mode"] == "selective"


def test_put_get_list_roundtrip_with_index_and_layout(tmp_path):
    store = open_store(str(tmp_path / "store"))
    entry = make_entry()
    assert store.put(entry) == (True, entry)
    assert store.get("llama3.1-8b", "h100:8", entry.stack_fingerprint) == entry
    assert store.get("llama3.1-8b", "h100:16", entry.stack_fingerprint) is None
    other = make_entry(model="llama3.1-70b", gpus=64)
    store.put(other)
    assert store.list() == [other, entry]  # sorted by key
    files = sorted(p.relative_to(tmp_path / "store").as_posix() for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert files == ["index.json", other.key, entry.key]  # no temporary files left behind
    index = json.loads((tmp_path / "store" / "index.json").read_text())
    assert index["entries"][entry.key]["tokens_per_sec_per_gpu"] == 8000.0
    assert "recipe_toml" not in index["entries"][entry.key]


@pytest.mark.parametrize("stored, incoming, kept", [
    (make_entry(8000), make_entry(9000), True),                          # faster verified wins
    (make_entry(8000), make_entry(7000), False),                         # slower verified loses
    (make_entry(8000), make_entry(8000, mlflow_run_id="other"), False),  # a tie keeps the stored one
    (make_entry(8000), make_entry(20000, verified=False), False),        # unverified never beats verified
    (make_entry(20000, verified=False), make_entry(5000), True),         # verified beats unverified
    (make_entry(9000), make_entry(8000, simulated=False), True),         # hardware beats the simulator
    (make_entry(8000, verified=False), make_entry(9000, verified=False), True),
])
def test_second_writer_keeps_the_better_verified_recipe(tmp_path, stored, incoming, kept):
    store = open_store(str(tmp_path))
    store.put(stored)
    assert store.put(incoming) == (kept, incoming if kept else stored)
    winner = incoming if kept else stored
    assert store.list() == [winner]
    assert store.index()["entries"][winner.key]["mlflow_run_id"] == winner.mlflow_run_id


def test_a_corrupt_entry_is_reported_not_overwritten(tmp_path):
    store = open_store(str(tmp_path))
    entry = make_entry()
    path = tmp_path / entry.key
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    with pytest.raises(StoreError, match="not a valid entry"):
        store.put(entry)
    assert path.read_text() == "{ not json"


def test_index_left_behind_by_a_dead_writer_is_repaired_by_the_next_put(tmp_path):
    store = open_store(str(tmp_path))
    entry = make_entry()
    store.put(entry)
    (tmp_path / "index.json").unlink()  # as if the writer died between the entry and the index
    assert store.put(make_entry(7000)) == (False, entry)
    assert list(store.index()["entries"]) == [entry.key]


def test_open_store_uris(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTUNE_STORE", raising=False)
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path / "home"))
    assert default_store_uri() == str(tmp_path / "home" / "store")
    assert isinstance(open_store(None).blobs, LocalBlobs)
    monkeypatch.delenv("ATTUNE_HOME")
    assert default_store_uri() == str(Path(".attune").resolve() / "store")  # one $ATTUNE_HOME, resolved
    monkeypatch.setenv("ATTUNE_STORE", str(tmp_path / "elsewhere"))
    assert open_store(None).location == str(tmp_path / "elsewhere")
    assert open_store(f"file://{tmp_path}/x").location == f"{tmp_path}/x"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # client creation makes no request
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    s3 = open_store("s3://bucket-name/some/prefix/")
    assert isinstance(s3.blobs, S3Blobs) and s3.location == "s3://bucket-name/some/prefix"
    assert repr(s3) == "RecipeStore('s3://bucket-name/some/prefix')"
    for bad in ("s3://", "gs://bucket/x"):
        with pytest.raises(InputError, match="--store"):
            open_store(bad)


@pytest.mark.parametrize("uri, needle", [
    ("ftp://host/x", "ftp://"), ("s3://", "s3://BUCKET"), ("s3://Bad_Bucket/x", "bucket name"),
    ("s3://bucket-name/../up", "prefix"), ("s3://bucket-name/a//b", "prefix")])
def test_store_location_refuses_bad_uris_without_touching_anything(uri, needle):
    with pytest.raises(InputError, match="--store") as err:
        store_location(uri)
    assert needle in str(err.value)


def test_store_location_refuses_a_file_for_a_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        store_location(str(tmp_path / "f"))
    assert store_location(str(tmp_path / "new")) == ("folder", str(tmp_path / "new"), "")


@pytest.mark.parametrize("key", ["../escape.json", "recipes/../../x", "/etc/passwd", "a//b", "x\n", ".hidden",
                                 "recipes/bad name/entry.json", ""])
def test_back_ends_refuse_keys_that_are_not_safe_names(tmp_path, key):
    """Defence in depth: whatever a caller builds a key from, no back end reads or writes outside its root."""
    blobs = LocalBlobs(tmp_path / "store")
    for call in (lambda: blobs.read(key), lambda: blobs.write(key, b"x"), lambda: blobs.write_if(key, b"x", None)):
        with pytest.raises(StoreError, match="names of letters"):
            call()
    s3 = S3Blobs("bucket-name", "team", client=object())
    if key:
        with pytest.raises(StoreError, match="names of letters"):
            s3.read(key)
    with pytest.raises(InputError, match="store key"):
        open_store(str(tmp_path / "store")).put_blob(key, b"x")
    assert not (tmp_path / "escape.json").exists() and list(tmp_path.rglob("*")) == []


def _writer(uri: str, payload: str, barrier, results) -> None:
    entry = StoreEntry.model_validate_json(payload)
    barrier.wait()  # all writers start their read-compare-write at the same moment
    kept, current = open_store(uri).put(entry)
    results.put((entry.mlflow_run_id, kept, current.mlflow_run_id))


def race(uri: str, entries: list[StoreEntry]) -> list[tuple[str, bool, str]]:
    """Each entry put by its own process, all released at once; returns (run id, kept, current)."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(len(entries)), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(uri, e.model_dump_json(), barrier, results)) for e in entries]
    for p in procs:
        p.start()
    out = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return out


def racing_entries() -> list[StoreEntry]:
    """Verified at 6000..9500 tok/s; unverified ones faster than all of them (they must not win)."""
    verified = [make_entry(6000 + 500 * i, simulated=False) for i in range(8)]
    unverified = [make_entry(12000 + 1000 * i, verified=False, simulated=False) for i in range(4)]
    return [e for pair in zip(verified, unverified + unverified) for e in pair]


def check_race_outcome(store, entries, outcome) -> None:
    best = max((e for e in entries if e.gate_passed), key=lambda e: e.tokens_per_sec_per_gpu)
    assert store.list() == [best]  # parses as a whole entry: nothing half-written
    assert store.index()["entries"][best.key]["mlflow_run_id"] == best.mlflow_run_id
    by_id = {e.mlflow_run_id: e for e in entries}
    assert sum(kept for _, kept, _ in outcome) >= 1
    for run_id, kept, current in outcome:  # a writer turned away was shown something at least as good
        assert kept or rank(by_id[current]) >= rank(by_id[run_id])


def test_concurrent_writers_in_processes_keep_the_best_verified(tmp_path):
    store = open_store(str(tmp_path / "store"))
    entries = racing_entries()
    outcome = race(store.location, entries)
    check_race_outcome(store, entries, outcome)
    assert not list((tmp_path / "store").rglob("*.tmp"))
