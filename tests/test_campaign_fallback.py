"""A candidate the gate refuses (here: float8 whose curves left the band) falls back, once, on the best
measured layout the config check passes without a numerics change, and the benchmark scores every
point of a campaign at what stopping there would ship."""

from __future__ import annotations

import pytest
from conftest import RECIPE_8B_H100

from attune.bench.trajectory import GateJudge, incumbent_trajectory, shipped_trajectory
from attune.campaign import finish
from attune.campaign.context import CampaignSettings
from attune.campaign.engine import fall_back, open_campaign, record_trial
from attune.recipe import load_recipe
from attune.stacks.base import TrialResult, TrialStatus

F8 = "quantize.float8"
REFUSED = {"passed": False, "config": {"violations": [], "defects": []},
           "convergence": {"passed": False, "reason": "loss curve outside the baseline band"}}


def _ok(recipe, levers, tps):
    return TrialResult(status=TrialStatus.OK, stack="sim", levers=levers, gpus=recipe.cluster.gpus, wall_time_s=3600,
                       tokens_per_sec_per_gpu=tps, mfu=0.4, step_time_s=2.0, peak_memory_gib=60.0, simulated=True)


@pytest.fixture
def campaign(write_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe(RECIPE_8B_H100))
    c = open_campaign(recipe, CampaignSettings(budget_gpu_hours=500), home=tmp_path)
    base = recipe.layout().levers()
    for tps in (5000.0, 5050.0, 4950.0):
        record_trial(c, "baseline", base, _ok(recipe, base, tps))
    return c


def test_a_refused_float8_incumbent_falls_back_on_the_best_exact_one(campaign):
    c = campaign
    base = c.recipe.layout().levers()
    exact = base | {"compile.enable": True}
    record_trial(c, "trial", exact, _ok(c.recipe, exact, 5600.0))
    float8 = exact | {F8: "rowwise"}
    record_trial(c, "trial", float8, _ok(c.recipe, float8, 6500.0))
    assert c.state.incumbent_record.levers == float8
    c.state.gate, c.state.phase = dict(REFUSED), "gate"
    assert fall_back(c)
    assert c.state.incumbent_record.levers == exact and c.state.phase == "confirm" and c.state.gate is None
    assert c.state.rejected[0]["levers"] == float8
    # the fallback passes: nothing more to fall back on, and the result says what happened
    c.state.gate = {"passed": True}
    assert not fall_back(c)
    message = finish.final_message(c)
    assert "refused the best candidate" in message and "loss curve outside" in message
    assert finish.campaign_result(c)["gate_rejected"][0]["levers"] == float8


def test_without_an_exact_candidate_the_refusal_keeps_the_baseline(campaign):
    c = campaign
    float8 = c.recipe.layout().levers() | {F8: "rowwise"}
    record_trial(c, "trial", float8, _ok(c.recipe, float8, 6500.0))
    c.state.gate = dict(REFUSED)
    assert not fall_back(c)
    assert c.state.incumbent_record.levers == float8 and not c.state.rejected
    assert "gate failed" in finish.final_message(c) and "kept the baseline" in finish.final_message(c)


def test_a_refusal_falls_back_on_the_best_exact_layout_measured_even_if_never_the_incumbent(campaign):
    """A planner that went for float8 first (estimator-topk does) still falls back on the best
    layout without a numerics change it measured, when that one beat the baseline."""
    c = campaign
    base = c.recipe.layout().levers()
    float8 = base | {F8: "rowwise"}
    exact = base | {"compile.enable": True}
    record_trial(c, "trial", float8, _ok(c.recipe, float8, 6500.0))
    record_trial(c, "trial", exact, _ok(c.recipe, exact, 5600.0))      # never the incumbent: 6500 is ahead
    assert c.state.incumbent_record.levers == float8
    c.state.gate = dict(REFUSED)
    assert fall_back(c) and c.state.incumbent_record.levers == exact


def test_the_trajectory_scores_what_stopping_there_would_ship(campaign):
    c = campaign
    base = c.recipe.layout().levers()
    exact = base | {"compile.enable": True}
    float8 = exact | {F8: "rowwise"}
    record_trial(c, "trial", exact, _ok(c.recipe, exact, 5600.0))
    record_trial(c, "trial", float8, _ok(c.recipe, float8, 6500.0))
    points = incumbent_trajectory(c.state)
    assert [levers for _, levers in points][-3:] == [base, exact, float8]
    # not gated yet: the float8 incumbent counts as refused, so stopping there ships the exact one
    assert [levers for _, levers in shipped_trajectory(c.state, c.recipe)][-2:] == [exact, exact]
    # the gate passed it: it ships
    c.state.gate = {"passed": True}
    assert shipped_trajectory(c.state, c.recipe)[-1][1] == float8
    # an exact-tier layout is judged by the config check alone: it passes, it is no numerics change
    assert GateJudge(c.recipe, c.state).verdict(exact) == (True, False)


def test_a_known_defect_refusal_falls_back_too(campaign):
    c = campaign
    base = c.recipe.layout().levers()
    exact = base | {"compile.enable": True}
    record_trial(c, "trial", exact, _ok(c.recipe, exact, 5600.0))
    defective = exact | {"parallelism.tensor_parallel_degree": 2, "parallelism.data_parallel_shard_degree": 32,
                         F8: "rowwise"}    # torchtitan#3109
    record_trial(c, "trial", defective, _ok(c.recipe, defective, 6800.0))
    assert c.state.incumbent_record.levers == defective
    c.state.gate = {"passed": False, "config": {"violations": [], "defects": [{"id": "TT-3109"}]}}
    assert fall_back(c) and c.state.incumbent_record.levers == exact
    c.state.gate = {"passed": False, "config": {"violations": [], "defects": []}, "convergence": {"passed": False}}
    assert not fall_back(c)            # once per campaign: the fallback's own refusal stands


def test_a_recipe_that_already_matches_a_known_defect_is_named(write_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    text = RECIPE_8B_H100.replace('"optimizer.lr" = 3e-4', '"optimizer.lr" = 3e-4\n"quantize.float8" = "rowwise"\n'
                                  '"parallelism.tensor_parallel_degree" = 2')
    recipe = load_recipe(write_recipe(text))
    c = open_campaign(recipe, CampaignSettings(budget_gpu_hours=500), home=tmp_path)
    record_trial(c, "baseline", recipe.layout().levers(), _ok(recipe, recipe.layout().levers(), 5000.0))
    assert [h["id"] for h in finish.baseline_defects(c)] == ["TT-3109"]
    assert "matches known defect(s) TT-3109" in finish.final_message(c)


def test_a_probe_runs_the_real_gate_once_and_the_final_gate_gives_its_verdict(write_recipe, tmp_path, monkeypatch):
    """The planner's probe (gate-probe) is the whole gate on the proxy, asked once per layout: the
    campaign keeps its verdict, the benchmark's replay knows it, and gating the same layout at the
    end reads the cached verdict instead of training the proxy again."""
    from attune.campaign.gate_runs import probe_layout

    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe(RECIPE_8B_H100))
    c = open_campaign(recipe, CampaignSettings(budget_gpu_hours=500, gate_steps=16), home=tmp_path)
    base = recipe.layout().levers()
    for tps in (5000.0, 5050.0, 4950.0):
        record_trial(c, "baseline", base, _ok(recipe, base, tps))
    float8 = c.recipe.layout().levers() | {F8: "tensorwise"}
    said: list[str] = []
    c.say = said.append                      # the flow's progress lines
    passed = probe_layout(c, float8)
    assert [(p["levers"], p["passed"]) for p in c.state.gate_probes] == [(float8, passed)]
    assert len(said) == 2 and "float8=tensorwise" in said[0] and said[1].startswith(
        f"gate probe: {'passed' if passed else 'refused'}")
    assert "tier numerics" in c.state.gate_probes[0]["note"]          # the proxy ran: not a config refusal
    assert probe_layout(c, float8) == passed and len(c.state.gate_probes) == 1 and len(said) == 2
    assert GateJudge(c.recipe, c.state).verdict(float8) == (passed, True)
    record_trial(c, "trial", float8, _ok(c.recipe, float8, 6500.0))
    assert c.state.incumbent_record.levers == float8
    report = finish.run_gate(c)
    assert report.get("cached") is True and report["passed"] == passed
