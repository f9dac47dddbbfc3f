"""Warm start (issue 37): a re-tune re-measures the earlier campaign's best layouts, fits a map old → new,
and where the ranks hold uses the old trials as prior data for the planner and the old noise in the test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from attune.campaign import warm_start
from attune.campaign.noise import gain_is_real
from attune.campaign.carried import OldLayout, WarmStart
from attune.levers import layout_key
from tests.conftest import assert_one_line_error

REPO = Path(__file__).resolve().parent.parent
CPU = REPO / "benchmarks" / "cpu"
SEARCH = CPU / "llama3_debug_search.toml"
TIGHT = CPU / "llama3_debug_search_tight.toml"
SEQ512 = CPU / "llama3_debug_seq512.toml"
SWEEP = CPU / "sweep-cpu2-2026-12-06.jsonl"


def _warm(tps: dict[str, float], noise: float = 0.02) -> WarmStart:
    return WarmStart(source="old", memory_gib=80.0, noise_sd=noise,
                     layouts=[OldLayout(levers={"x": name}, tps=value, runs=1) for name, value in tps.items()])


def test_the_map_holds_where_the_layouts_move_together_and_not_where_one_reorders():
    warm = _warm({"a": 100.0, "b": 120.0, "c": 90.0})
    key = lambda name: layout_key({"x": name})   # noqa: E731
    same = warm_start.fit_map(warm, {key("a"): [110.0], key("b"): [133.0], key("c"): [99.0]}, noise_sd=0.02)
    assert same.holds and same.pairs == 3 and math.isclose(math.exp(same.scale), 1.10, rel_tol=0.01)
    moved = warm_start.fit_map(warm, {key("a"): [110.0], key("b"): [100.0], key("c"): [99.0]}, noise_sd=0.02)
    assert not moved.holds and "moved" in moved.why
    alone = warm_start.fit_map(warm, {key("a"): [110.0]}, noise_sd=0.02)
    assert not alone.holds and alone.pairs == 1


def test_the_shipped_layout_is_re_measured_first_and_a_failed_one_is_replaced():
    layouts = [OldLayout(levers={"x": n}, tps=t, runs=1) for n, t in (("best", 130.0), ("base", 100.0),
                                                                     ("second", 120.0), ("third", 110.0))]
    order = warm_start._remeasure(layouts, shipped={"x": "second"}, baseline={"x": "base"})
    assert order[:3] == [{"x": "second"}, {"x": "best"}, {"x": "third"}]
    warm = WarmStart(source="old", memory_gib=80.0, noise_sd=0.02, layouts=layouts, remeasure=order)
    # the shipped one ran out of memory now: the next is tried until two layouts of the earlier
    # campaign ran here (the baseline is one)
    assert warm_start.next_remeasure(warm, [{"x": "base"}, {"x": "second"}], ran=[{"x": "base"}]) == {"x": "best"}
    assert warm_start.next_remeasure(warm, [{"x": "base"}, {"x": "second"}, {"x": "best"}],
                                     ran=[{"x": "base"}, {"x": "best"}]) is None
    # an earlier campaign that never ran this baseline: two re-measured layouts
    assert warm_start.next_remeasure(warm, [{"x": "new"}, {"x": "second"}], ran=[{"x": "new"}, {"x": "second"}]) \
        == {"x": "best"}


def test_an_earlier_campaigns_spread_gives_a_one_confirmation_test_its_power_and_no_false_gain():
    base, confirmation = [500.0, 565.0], [1060.0]      # two baseline runs 13% apart, +112% on one confirmation
    alone, p_alone = gain_is_real(base, confirmation, margin=0.17)
    pooled, p_pooled = gain_is_real(base, confirmation, margin=0.17, earlier=(0.09, 6))
    assert not alone and pooled and p_pooled < p_alone
    rng = np.random.default_rng(0)
    false = 0
    for _ in range(2000):   # no gain: the pooled test still passes about alpha of the time at most
        b = list(np.exp(rng.normal(0, 0.09, 2)))
        c = list(np.exp(rng.normal(0, 0.09, 1)))
        false += gain_is_real(b, c, margin=0.0, earlier=(0.09, 6))[0]
    assert false / 2000 < 0.07


def test_old_trials_narrow_the_belief_at_the_layouts_they_measured():
    from attune.planners.base import Observation
    from attune.planners.belief import Belief, measured_arrays
    from attune.planners.residual_gp import features
    from attune.recipe import load_recipe
    from attune.space import iter_layouts
    from attune.stacks.base import TrialResult, TrialStatus

    recipe = load_recipe(SEARCH)
    layouts = [lay.levers() for lay in iter_layouts(recipe)]
    base, old = recipe.layout().levers(), layouts[-1]

    def seen(levers, tps):
        return Observation(levers=levers, result=TrialResult(status=TrialStatus.OK, stack="measured", levers=levers,
                                                              gpus=2, wall_time_s=1.0, tokens_per_sec_per_gpu=tps))
    history = [seen(base, 500.0)]
    arrays = measured_arrays(recipe, [old])
    fresh = Belief()
    _, sd_fresh = fresh.throughput(recipe, history, arrays, features(arrays), 0.05)
    warm = Belief(prior=[seen(old, 1000.0)], prior_sd=0.05)
    mean_warm, sd_warm = warm.throughput(recipe, history, arrays, features(arrays), 0.05)
    assert sd_warm[0] < 0.5 * sd_fresh[0]
    assert abs(math.exp(mean_warm[0]) / 1000.0 - 1) < 0.1


def test_a_re_tune_on_real_sweeps_re_measures_the_shipped_layout_and_carries_the_old_trials(cli, tmp_path):
    env = {"ATTUNE_MEASURED_TABLE": str(SWEEP)}
    first = cli("tune", SEARCH, "--stack", "measured", "--budget-gpu-hours", "0.25", "--json", env_extra=env)
    assert first.returncode == 0, first.stderr[-2000:]
    old = json.loads(first.stdout)
    assert old["shipped"]
    store = tmp_path / ".attune" / "store"
    name = Path(old["campaign_dir"]).name
    kept = json.loads((store / "campaigns" / name.rsplit("-", 1)[0] / f"{name}.json").read_text())
    assert kept["state"]["phase"] == "done" and kept["campaign"] == name
    # the re-tune runs on another machine: an empty ATTUNE_HOME, the same recipe store; `auto` finds the
    # earlier campaign there and copies it under the new home
    elsewhere = tmp_path / "elsewhere"
    again = cli("tune", SEARCH, "--stack", "measured", "--budget-gpu-hours", "0.09", "--seed", "1",
                "--warm-start", "auto", "--json",
                env_extra=env | {"ATTUNE_HOME": str(elsewhere), "ATTUNE_STORE": str(store)})
    assert again.returncode == 0, again.stderr[-2000:]
    result = json.loads(again.stdout)
    carried = result["warm_start"]
    assert carried["source"] == name and (elsewhere / "campaigns" / name / "state.json").is_file()
    assert old["best"]["levers"] in carried["remeasured"]   # the shipped one, measured again
    assert carried["map"]["holds"] and carried["layouts_carried"] >= 3
    assert "the ranks hold" in again.stderr
    state = json.loads((Path(result["campaign_dir"]) / "state.json").read_text())
    trials = [t for t in state["trials"] if t["role"] == "trial"]
    assert trials[0]["levers"] == old["best"]["levers"] and "warm start" in trials[0]["rationale"]
    assert result["gpu_hours_used"] <= 0.09


def test_a_warm_start_from_another_model_is_one_line_and_leaves_nothing(cli, write_recipe, tmp_path):
    env = {"ATTUNE_MEASURED_TABLE": str(SWEEP)}
    first = cli("tune", SEARCH, "--stack", "measured", "--budget-gpu-hours", "0.05", "--json", env_extra=env)
    assert first.returncode == 0, first.stderr[-2000:]
    source = json.loads(first.stdout)["campaign_dir"]
    campaigns = sorted((tmp_path / ".attune" / "campaigns").iterdir())
    other = write_recipe()   # llama3 8B on the sim
    proc = cli("tune", other, "--budget-gpu-hours", "40", "--warm-start", source)
    assert_one_line_error(proc, "--warm-start", "same model")
    assert sorted((tmp_path / ".attune" / "campaigns").iterdir()) == campaigns
    missing = cli("tune", other, "--budget-gpu-hours", "40", "--warm-start", "nosuchcampaign")
    assert_one_line_error(missing, "--warm-start", "no campaign")


def test_an_earlier_campaign_whose_layouts_this_recipe_does_not_allow_starts_a_fresh_one(tmp_path):
    """A layout that does not divide the new batch does not transfer; with none left, nothing does,
    said once. A pipeline schedule outside the new search does not matter without a pipeline."""
    from attune.campaign.state import CampaignState, TrialRecord
    from attune.recipe import dump_recipe, load_recipe
    from attune.stacks.base import TrialResult, TrialStatus

    old_recipe = load_recipe(SEARCH)
    # local batch 4 on two data-parallel processes: 8 sequences, seq512's global batch is 4
    levers = old_recipe.layout().levers() | {"training.local_batch_size": 4}
    record = TrialRecord(index=0, role="baseline", levers=levers, config={}, result=TrialResult(
        status=TrialStatus.OK, stack="measured", levers=levers, gpus=2, wall_time_s=1.0, tokens_per_sec_per_gpu=500.0))
    state = CampaignState(campaign_id="x", recipe_toml=dump_recipe(old_recipe), settings={},
                          budget={"total_gpu_hours": 1.0}, trials=[record])
    state.save(tmp_path / "state.json")
    same = warm_start.load(tmp_path, old_recipe)
    assert same.layouts and same.map is None
    other = warm_start.load(tmp_path, load_recipe(SEQ512))
    assert other.layouts == [] and other.remeasure == []
    assert not other.map.holds and "fresh campaign" in other.map.why
    assert warm_start.observations(other, load_recipe(SEQ512), "measured") == []
    other.spread = (0.09, 5)   # its noise does not decide this campaign's baseline runs either
    assert warm_start.baseline_spread(other) is None and warm_start.earlier_spread(other) is None
    # the baseline layout itself (pp 1, schedule 1F1B where seq512 searches Interleaved1F1B) transfers
    state.trials[0] = record.model_copy(update={"levers": old_recipe.layout().levers()})
    state.save(tmp_path / "state.json")
    assert len(warm_start.load(tmp_path, load_recipe(SEQ512)).layouts) == 1


def test_a_warm_start_skips_the_third_baseline_run_where_the_earlier_noise_explains_the_two():
    from attune.campaign import protocol as proto
    p = proto.choose(budget=1.0, replicates=3, steps_per_trial=10, run_cost=0.2, screen_cost=0.1)
    assert p.fitted
    two = [500.0, 560.0]   # 8% apart
    assert proto.more_baseline(p, 2, two, left=0.8, screen_cost=0.1)[0]
    skip, why = proto.more_baseline(p, 2, two, left=0.8, screen_cost=0.1, earlier=(0.09, 5))
    assert not skip and "earlier campaign" in why
    # far wider than the earlier noise: something changed, the third is measured
    assert proto.more_baseline(p, 2, [400.0, 640.0], left=0.8, screen_cost=0.1, earlier=(0.09, 5))[0]


def test_a_layout_whose_old_peak_is_above_the_new_memory_is_not_re_measured():
    layouts = [OldLayout(levers={"x": "big"}, tps=130.0, runs=1, peak_memory_gib=0.85),
               OldLayout(levers={"x": "small"}, tps=120.0, runs=1, peak_memory_gib=0.75)]
    assert warm_start._remeasure(layouts, shipped={"x": "big"}, baseline={}, memory_gib=0.80) == [{"x": "small"}]
    assert warm_start._remeasure(layouts, shipped={"x": "big"}, baseline={}, memory_gib=0.90)[0] == {"x": "big"}


def test_spreads_measured_apart_pool_by_their_degrees_of_freedom():
    from attune.campaign.noise import pool_spreads
    sd, dof = pool_spreads((0.1, 2), (0.2, 6), None)
    assert dof == 8 and math.isclose(sd, math.sqrt((0.01 * 2 + 0.04 * 6) / 8))
    assert pool_spreads(None, None) is None


def test_auto_takes_the_latest_finished_campaign_of_the_store_and_never_a_path_it_names(tmp_path):
    """`--warm-start auto` with nothing under ATTUNE_HOME: the store's latest finished campaign of the
    recipe, copied under ATTUNE_HOME; an object whose folder name is not a safe name of this recipe's
    is passed over, and nothing is written for it."""
    from attune.campaign import store_campaigns
    from attune.campaign.state import CampaignState
    from attune.campaign.budget import Budget
    from attune.store import open_store
    store, home = str(tmp_path / "store"), tmp_path / "home"
    blobs = open_store(store).blobs

    def put(folder: str, finished: str, phase: str = "done", recipe: str = "r") -> None:
        state = CampaignState(campaign_id=folder.rsplit("-", 1)[-1], recipe_toml="", settings={},
                              budget=Budget(total_gpu_hours=1.0)).model_copy(update={"phase": phase})
        row = store_campaigns.StoredCampaign(campaign=folder, recipe=recipe, finished=finished,
                                             state=state.model_dump(mode="json"))
        safe = "hostile" if "/" in folder else folder   # the object's key is safe; the name inside it is not
        blobs.write(f"campaigns/{recipe}/{safe}.json", row.model_dump_json().encode(), "application/json")

    assert store_campaigns.fetch(store, "r", home) is None
    put("r-aaa", "2026-12-01T00:00:00+00:00")
    put("r-bbb", "2026-12-03T00:00:00+00:00")
    put("r-ccc", "2026-12-04T00:00:00+00:00", phase="search")   # not finished
    blobs.write("campaigns/r/junk.json", b"{not json", "application/json")
    folder = store_campaigns.fetch(store, "r", home)
    assert folder is not None and folder.name == "r-bbb" and (folder / "state.json").is_file()
    put("../../escape", "2026-12-05T00:00:00+00:00")
    put("other-ddd", "2026-12-06T00:00:00+00:00")
    assert store_campaigns.latest(store, "r").campaign == "r-bbb"
    again = store_campaigns.fetch(store, "r", tmp_path / "home2")
    assert again is not None and again.name == "r-bbb"
    assert [p.name for p in (tmp_path / "home2" / "campaigns").iterdir()] == ["r-bbb"]
    assert not (tmp_path / "escape").exists()


def test_auto_takes_whichever_finished_later_of_this_machines_campaign_and_the_stores(tmp_path):
    """A teammate's (or another worker's) re-tune that finished after this machine's last one is the
    one `auto` starts from; an older one in the store is not, and the local one is used as it is."""
    import os

    from attune.campaign import store_campaigns
    from attune.campaign.budget import Budget
    from attune.campaign.state import CampaignState
    from attune.campaign.warm_start import find_source
    from attune.store import open_store
    store, home = str(tmp_path / "store"), tmp_path / "home"

    def state(cid: str) -> CampaignState:
        return CampaignState(campaign_id=cid, recipe_toml='name = "r"\n', settings={},
                             budget=Budget(total_gpu_hours=1.0)).model_copy(update={"phase": "done"})

    local = home / "campaigns" / "r-mine"
    local.mkdir(parents=True)
    (local / "state.json").write_text(state("mine").model_dump_json())
    finished = 1_796_000_000   # 2026-11-30: this machine's campaign finished then
    os.utime(local / "state.json", (finished, finished))

    def put(folder: str, when: str) -> None:
        row = store_campaigns.StoredCampaign(campaign=folder, recipe="r", finished=when,
                                             state=state(folder.removeprefix("r-")).model_dump(mode="json"))
        open_store(store).blobs.write(store_campaigns.key("r", folder), row.model_dump_json().encode(), "application/json")

    put("r-older", "2026-11-01T00:00:00+00:00")
    assert find_source("auto", "r", home, store) == local
    assert not (home / "campaigns" / "r-older").exists()
    put("r-teammate", "2026-12-05T00:00:00+00:00")
    picked = find_source("auto", "r", home, store)
    assert picked == home / "campaigns" / "r-teammate" and (picked / "state.json").is_file()
    assert find_source("auto", "r", home, store) == picked   # copied once; the copy is the latest now
