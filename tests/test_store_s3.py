"""The recipe store on S3 against a real local S3 endpoint: moto's server mode, started here as a
subprocess on 127.0.0.1 and stopped by its pid (no in-process patching)."""

from __future__ import annotations

import json
import uuid

import boto3
import pytest
from botocore.exceptions import ClientError

from attune.cli.main import main
from attune.store import StoreError, open_store
from prefect_server import free_port
from s3_server import s3_server
from test_store import check_race_outcome, make_entry, race, racing_entries

SECRET = "sEcReT-do-not-print-0123456789abcdef"
KEY_ID = "AKIAKEYIDNEVERSHOWN"


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    with s3_server(tmp_path_factory.mktemp("moto")) as url:
        yield url


@pytest.fixture
def bucket(s3_endpoint, monkeypatch, tmp_path):
    """A fresh bucket; the AWS environment points boto3 at moto with throw-away credentials."""
    for name, value in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": KEY_ID,
                        "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    name = f"attune-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


def test_moto_enforces_conditional_puts(bucket):
    """What the store's compare-and-swap rests on: If-None-Match and If-Match on PutObject."""
    s3 = boto3.client("s3")
    etag = s3.put_object(Bucket=bucket, Key="k", Body=b"1", IfNoneMatch="*")["ETag"]
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="k", Body=b"2", IfNoneMatch="*")
    assert err.value.response["Error"]["Code"] == "PreconditionFailed"
    new = s3.put_object(Bucket=bucket, Key="k", Body=b"3", IfMatch=etag)["ETag"]
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="k", Body=b"4", IfMatch=etag)  # stale: someone wrote since
    assert err.value.response["Error"]["Code"] == "PreconditionFailed"
    assert s3.get_object(Bucket=bucket, Key="k")["ETag"] == new


def test_s3_roundtrip_layout_and_index(bucket):
    store = open_store(f"s3://{bucket}/team/bench")
    entry, slower = make_entry(9000), make_entry(7000)
    assert store.put(entry) == (True, entry)
    assert store.put(slower) == (False, entry)
    assert store.get("llama3.1-8b", "h100:8", entry.stack_fingerprint) == entry
    assert store.list() == [entry]
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(keys) == sorted([f"team/bench/{entry.key}", "team/bench/index.json"])  # one object per entry
    assert store.index()["entries"][entry.key]["tokens_per_sec_per_gpu"] == 9000.0
    where = store.put_blob("leaderboard/index.html", b"<html></html>")
    assert where == f"s3://{bucket}/team/bench/leaderboard/index.html"
    head = boto3.client("s3").head_object(Bucket=bucket, Key="team/bench/leaderboard/index.html")
    assert head["ContentType"].startswith("text/html")


def test_s3_concurrent_writers_keep_the_best_verified(bucket):
    uri = f"s3://{bucket}/race"
    entries = racing_entries()
    outcome = race(uri, entries)
    check_race_outcome(open_store(uri), entries, outcome)


def test_s3_errors_name_the_store_never_endpoint_or_credentials(bucket, s3_endpoint, monkeypatch, capsys):
    missing = open_store(f"s3://{bucket}-missing/p")
    with pytest.raises(StoreError) as err:
        missing.list()
    assert "bucket does not exist" in str(err.value)
    port = s3_endpoint.rsplit(":", 1)[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    dead = open_store(f"s3://{bucket}/p")
    with pytest.raises(StoreError) as err:
        dead.put(make_entry())
    assert err.value.__context__ is None and err.value.__cause__ is None
    shown = " ".join([str(err.value), repr(err.value), repr(dead), repr(dead.blobs), str(vars(dead.blobs))])
    for secret in (SECRET, KEY_ID, "127.0.0.1", port):
        assert secret not in shown
    assert main(["leaderboard", "--store", f"s3://{bucket}/p", "--no-seed"]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "cannot reach S3" in err, err
    for secret in (SECRET, KEY_ID, "127.0.0.1", port):
        assert secret not in out + err


def test_leaderboard_show_and_publish_on_s3(bucket, capsys):
    """In-process CLI (the subprocess path is covered in test_leaderboard.py): saves two start-ups."""
    uri = f"s3://{bucket}/bench"
    store = open_store(uri)
    store.put(make_entry(9000))
    store.put(make_entry(5000, model="qwen3-30b-a3b", simulated=False))
    assert main(["leaderboard", "--store", uri, "--no-seed", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["model"], r["simulated"]) for r in rows] == [("llama3.1-8b", True), ("qwen3-30b-a3b", False)]
    assert main(["leaderboard", "publish", "--store", uri, "--no-seed"]) == 0
    assert f"{uri}/leaderboard/index.html" in capsys.readouterr().out
    s3 = boto3.client("s3")
    page = s3.get_object(Bucket=bucket, Key="bench/leaderboard/index.html")["Body"].read().decode()
    assert "qwen3-30b-a3b" in page and "simulated" in page
    data = json.loads(s3.get_object(Bucket=bucket, Key="bench/leaderboard/leaderboard.json")["Body"].read())
    assert len(data["rows"]) == 2


def test_the_lessons_ledger_on_s3_is_one_object_per_campaign_and_attune_lessons_reads_it(bucket, capsys):
    from attune.lessons import ledger
    from attune.lessons.ledger import CampaignMoves, Context, Move
    uri = f"s3://{bucket}/team"
    context = Context.of(True, 16e9, "h100", 64, "sim torchtitan 0.3.0 torch 2.13.0")
    blobs = open_store(uri).blobs
    for name, gain in (("c1", 0.1), ("c1", 0.2), ("c2", -0.05)):   # c1 resumed: its object replaced
        ledger.write(blobs, CampaignMoves(campaign=name, at="", model="m", context=context, moves=[
            Move(changes={"training.local_batch_size": (2, 4)}, symptoms=["memory_headroom"], gain=gain, sd=0.02)]))
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(keys) == ["team/lessons/ledger/c1.json", "team/lessons/ledger/c2.json"]
    assert main(["lessons", "--store", uri, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["campaigns_in_ledger"] == 2 and payload["store"] == uri
    row = next(r for r in payload["lessons"] if r["id"] == "headroom-bigger-microbatch")
    assert row["campaigns"] == 2 and "over 2 campaigns" in row["evidence"]


def test_a_finished_campaign_on_s3_is_what_warm_start_auto_finds_on_another_machine(bucket, tmp_path):
    """A re-tune on a fresh worker has no campaign under its ATTUNE_HOME: `auto` takes the latest
    finished campaign of the recipe from the S3 store and copies it under that home."""
    from attune.campaign import store_campaigns
    from attune.campaign.budget import Budget
    from attune.campaign.state import CampaignState
    uri = f"s3://{bucket}/team"
    blobs = open_store(uri).blobs
    for folder, finished in (("r-c1", "2026-12-01T00:00:00+00:00"), ("r-c2", "2026-12-02T00:00:00+00:00")):
        state = CampaignState(campaign_id=folder[2:], recipe_toml="", settings={}, budget=Budget(total_gpu_hours=1.0),
                              phase="done")
        blobs.write(store_campaigns.key("r", folder), store_campaigns.StoredCampaign(
            campaign=folder, recipe="r", finished=finished, state=state.model_dump(mode="json")).model_dump_json().encode(),
            "application/json")
    keys = sorted(o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["team/campaigns/r/r-c1.json", "team/campaigns/r/r-c2.json"]
    folder = store_campaigns.fetch(uri, "r", tmp_path / "worker")
    assert folder == tmp_path / "worker" / "campaigns" / "r-c2"
    assert CampaignState.load(folder / "state.json").phase == "done"
