"""The lessons ledger: what campaigns write, how a lesson's prior learns from it, `attune lessons`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from attune.campaign.diagnosis import Symptom
from attune.campaign.state import TrialRecord
from attune.lessons import ledger
from attune.lessons.catalog import load_lessons
from attune.lessons.ledger import CampaignMoves, Context, Move
from attune.lessons.posterior import BETWEEN, MIN_WIDTH, makes_move, posterior
from attune.levers import layout_key
from attune.stacks.base import TrialResult, TrialStatus
from attune.store.local import LocalBlobs

REPO = Path(__file__).resolve().parent.parent
SEARCH = REPO / "benchmarks" / "cpu" / "llama3_debug_search.toml"
SWEEP = REPO / "benchmarks" / "cpu" / "sweep-cpu2-2026-12-06.jsonl"
MB = "training.local_batch_size"
AC = "activation_checkpoint.mode"
MOE_64 = Context.of(True, 16e9, "h100", 64, "sim torchtitan 0.3.0 torch 2.13.0")


def _lesson(lesson_id: str):
    return next(ls for ls in load_lessons() if ls.id == lesson_id)


def _campaign(name: str, gains: list[float], context: Context = MOE_64, symptoms=("memory_headroom",),
              changes=None) -> CampaignMoves:
    changes = changes or {MB: (2, 4)}
    return CampaignMoves(campaign=name, at="2026-12-07T00:00:00+00:00", model="m", context=context,
                         moves=[Move(changes=changes, symptoms=list(symptoms), gain=g, sd=0.02) for g in gains])


def _trial(index: int, role: str, levers: dict, tps: float | None, parent: int | None = None,
           diagnosis: tuple[str, ...] = ()) -> TrialRecord:
    ok = tps is not None
    result = TrialResult(status=TrialStatus.OK if ok else TrialStatus.OOM, stack="sim", levers=levers, gpus=8,
                         tokens_per_sec_per_gpu=tps, step_time_s=1.0 if ok else None, wall_time_s=10.0)
    return TrialRecord(index=index, role=role, levers=levers, config={}, result=result, parent=parent,
                       diagnosis=[Symptom(id=s, evidence="") for s in diagnosis])


def test_a_campaign_s_rows_are_its_moves_against_the_incumbent_they_left_once_per_layout():
    base, up, fsdp = {MB: 2, AC: "full"}, {MB: 4, AC: "full"}, {MB: 2, AC: "none"}
    trials = [_trial(0, "baseline", base, 1000.0, diagnosis=("memory_headroom",)),
              _trial(1, "baseline", base, 1020.0, diagnosis=("memory_headroom",)),
              _trial(2, "trial", up, 1210.0, parent=0),
              _trial(3, "trial", fsdp, None, parent=2),          # OOM, moved from the new incumbent
              _trial(4, "confirm", up, 1190.0)]
    runs = {layout_key(base): [1000.0, 1020.0], layout_key(up): [1210.0, 1190.0]}   # CampaignState.runs_by_layout
    rows = ledger.moves_of(trials, runs, 0.02)
    assert len(rows) == 2
    first, second = rows
    assert first.changes == {MB: (2, 4)} and first.symptoms == ["memory_headroom"]
    assert first.gain == pytest.approx(1200 / 1010 - 1)
    assert first.sd == pytest.approx(0.02 * math.sqrt(1 / 2 + 1 / 2))   # two runs of each
    assert second.changes == {MB: (4, 2), AC: ("full", "none")} and second.gain is None and second.status == "oom"


def test_without_evidence_a_lesson_s_prior_is_the_catalog_s_figure():
    lesson = _lesson("headroom-bigger-microbatch")
    belief = posterior(lesson, [], MOE_64)
    assert belief.mean == pytest.approx(math.log1p(lesson.expected_gain))
    assert belief.sd == pytest.approx(max(abs(belief.mean), MIN_WIDTH)) and belief.campaigns == 0
    assert "catalog; no campaign measured it yet" in belief.text()


def test_campaigns_that_found_a_move_useless_sink_its_prior_below_zero():
    lesson = _lesson("headroom-bigger-microbatch")
    assert makes_move(lesson, Move(changes={MB: (2, 4)}, gain=0.0, sd=0.0))
    assert not makes_move(lesson, Move(changes={MB: (4, 2)}, gain=0.0, sd=0.0))
    assert not makes_move(lesson, Move(changes={MB: (2, 4), AC: ("full", "none")}, gain=1.2, sd=0.0))  # not alone
    assert makes_move(lesson, Move(changes={MB: (2, 4), "parallelism.data_parallel_shard_degree": (2, 1)},
                                   gain=0.0, sd=0.0))   # the shard degree follows the others
    useless = [_campaign(f"c{i}", [-0.04, -0.06]) for i in range(6)]
    belief = posterior(lesson, useless, MOE_64)
    assert belief.campaigns == 6 and belief.gain < 0 < lesson.expected_gain
    assert belief.sd < posterior(lesson, [], MOE_64).sd
    assert "over 6 campaigns on MoE 10-100B on h100 at 64-256 GPUs" in belief.text()


def test_evidence_from_another_context_counts_less_and_another_family_not_at_all():
    lesson = _lesson("headroom-bigger-microbatch")
    elsewhere = Context.of(True, 400e9, "b200", 512, "torchtitan torchtitan 0.3.1 torch 2.13.0")
    dense = Context.of(False, 16e9, "h100", 64, MOE_64.stack)
    here = posterior(lesson, [_campaign(f"c{i}", [0.30]) for i in range(3)], MOE_64)
    far = posterior(lesson, [_campaign(f"c{i}", [0.30], context=elsewhere) for i in range(3)], MOE_64)
    other_family = posterior(lesson, [_campaign(f"c{i}", [0.30], context=dense) for i in range(3)], MOE_64)
    catalog = posterior(lesson, [], MOE_64)
    assert here.mean > far.mean > catalog.mean and here.sd < far.sd
    assert other_family.campaigns == 0 and other_family.mean == pytest.approx(catalog.mean)
    # a campaign's rows share its luck: ten rows of one campaign are one observation
    one = posterior(lesson, [_campaign("c0", [0.30] * 10)], MOE_64)
    assert one.campaigns == 1 and one.sd ** -2 == pytest.approx(catalog.sd ** -2 + 1 / (0.02 ** 2 + BETWEEN ** 2))


def test_the_ledger_is_one_object_per_campaign_and_skips_what_it_cannot_read(tmp_path):
    blobs = LocalBlobs(tmp_path / "store")
    ledger.write(blobs, _campaign("c1", [0.1]))
    ledger.write(blobs, _campaign("c1", [0.2]))     # a resumed campaign replaces what it wrote
    ledger.write(blobs, _campaign("c2", [0.3]))
    blobs.write(ledger.PREFIX + "junk.json", b"{not json", "application/json")
    entries, unreadable = ledger.read(blobs)
    assert [e.campaign for e in entries] == ["c1", "c2"] and entries[0].moves[0].gain == 0.2
    assert unreadable == [ledger.PREFIX + "junk.json"]
    with pytest.raises(Exception, match="letters, digits"):
        ledger.write(blobs, _campaign("../escape", [0.1]))   # a campaign id never becomes a path unchecked


def test_a_finished_campaign_writes_the_ledger_and_the_next_one_starts_from_it(cli, tmp_path):
    """Real campaigns on the CPU sweep (measured stack): the first writes its moves, a second keeps a
    copy of the ledger in its folder, and `attune lessons` shows what was measured (that a resumed
    campaign counts once: tests/test_campaign_kill_points.py kills at every save point)."""
    env = {"ATTUNE_MEASURED_TABLE": str(SWEEP)}
    first = cli("tune", SEARCH, "--stack", "measured", "--budget-gpu-hours", "0.1", "--json", env_extra=env)
    assert first.returncode == 0, first.stderr[-2000:]
    state = json.loads((Path(json.loads(first.stdout)["campaign_dir"]) / "state.json").read_text())
    store = LocalBlobs(tmp_path / ".attune" / "store")
    entries, _ = ledger.read(store)
    assert [e.campaign for e in entries] == [state["campaign_id"]] and state["lessons_recorded"]
    searched = {json.dumps(t["levers"], sort_keys=True) for t in state["trials"] if t["role"] == "trial"}
    assert 0 < len(entries[0].moves) <= len(searched)
    assert entries[0].context.gpus == "1-8" and entries[0].context.stack.startswith("measured torchtitan ")
    second = cli("tune", SEARCH, "--stack", "measured", "--budget-gpu-hours", "0.1", "--seed", "2", "--json",
                 env_extra=env)
    assert second.returncode == 0, second.stderr[-2000:]
    snapshot = json.loads((Path(json.loads(second.stdout)["campaign_dir"]) / "ledger.json").read_text())
    assert [e["campaign"] for e in snapshot] == [state["campaign_id"]]
    payload = json.loads(cli("lessons", "--json", check=True).stdout)
    assert payload["campaigns_in_ledger"] == 2 and payload["unreadable"] == []
    assert {r["id"] for r in payload["lessons"]} == {ls.id for ls in load_lessons()}
    assert all(r["campaigns"] <= 2 for r in payload["lessons"])
    text = cli("lessons", SEARCH, "--stack", "measured", check=True).stdout
    assert "2 campaign(s) in the ledger" in text and "dense <1B on cpu at 1-8 GPUs" in text


def test_only_a_campaign_whose_planner_reads_lessons_copies_the_ledger(write_recipe, tmp_path, monkeypatch):
    """The ledger is one object per earlier campaign (a GET each on S3): random search, bayes and the
    estimator's top-k never read it, so their campaigns do not fetch it."""
    from attune.campaign import engine, lessons_ledger
    from attune.campaign.context import CampaignSettings
    from attune.recipe import load_recipe
    from tests.conftest import RECIPE_8B_H100
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    store = tmp_path / "store"
    ledger.write(LocalBlobs(store), CampaignMoves(campaign="earlier", at="", model="m", context=MOE_64, moves=[
        Move(changes={MB: (2, 4)}, symptoms=["memory_headroom"], gain=0.1, sd=0.02)]))
    recipe = load_recipe(write_recipe(RECIPE_8B_H100))
    for planner, copies in (("attune", ["earlier"]), ("random", [])):
        c = engine.open_campaign(recipe, CampaignSettings(budget_gpu_hours=500, planner=planner), home=tmp_path,
                                 store=str(store))
        try:
            assert [e.campaign for e in lessons_ledger.load_snapshot(c.directory)] == copies, planner
            assert [e.campaign for e in c.ledger] == copies
        finally:
            engine.close_campaign(c)
