"""Baseline planners as the benchmark needs them, and the incumbent replay it scores campaigns with.
Runs the campaign's steps directly on the sim stack (no Prefect, MLflow or gate): a few seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from attune.bench.trajectory import incumbent_trajectory
from attune.campaign import engine
from attune.campaign.context import CampaignSettings
from attune.campaign.engine import BudgetExhausted
from attune.planners.registry import make_planner
from attune.campaign.inputs import load_campaign_recipe

RECIPE = REPO / "recipes" / "public" / "llama3_8b.toml"


def _search(tmp_path: Path, planner: str, budget: float = 20.0, seed: int = 0):
    recipe = load_campaign_recipe(str(RECIPE))
    settings = CampaignSettings(budget_gpu_hours=budget, planner=planner, seed=seed, replicates=2)
    c = engine.open_campaign(recipe, settings, home=tmp_path)
    base = recipe.layout().levers()
    for _ in range(settings.replicates):
        engine.record_trial(c, "baseline", base, engine.execute_attempt(c, "baseline", base))
    while (proposal := engine.next_proposal(c)) is not None:
        try:
            result = engine.execute_attempt(c, "trial", proposal.levers, engine.confirm_reserve(c, proposal.levers))
        except BudgetExhausted:
            break
        engine.record_trial(c, "trial", proposal.levers, result, proposal)
    return c


@pytest.mark.parametrize("planner", ["random", "bayes", "bayes-warm", "estimator-topk", "estimator-topk-naive",
                                     "attune"])
def test_planners_stay_in_budget_and_never_repeat(tmp_path, planner):
    c = _search(tmp_path, planner)
    trials = [t.levers for t in c.state.of_role("trial")]
    assert trials, c.state.stop_reason
    assert len({tuple(sorted(t.items())) for t in trials}) == len(trials)
    assert c.state.budget.spent_gpu_hours <= c.state.budget.total_gpu_hours
    # the planner stopped (nothing affordable or nothing left), it was not cut off mid-proposal by the
    # engine's budget check (engine.BudgetExhausted: "budget spent: the next trial needs ...")
    assert "the next trial needs" not in (c.state.stop_reason or ""), c.state.stop_reason


def test_estimator_topk_naive_measures_in_predicted_order(tmp_path):
    from attune.planners.estimates import rank_layouts

    c = _search(tmp_path, "estimator-topk-naive", budget=12.0)
    ranked = rank_layouts(c.recipe)
    first = [ranked[i] for i in range(5)]
    measured = [t.levers for t in c.state.of_role("trial")]
    assert measured[0] == first[0]          # the estimator's best is affordable here
    order = [first.index(m) for m in measured if m in first]
    assert order == sorted(order)


def test_gated_estimator_topk_measures_only_what_the_gate_would_pass_with_memory_to_spare(tmp_path):
    """The fair strongest baseline: attune's knowledge of the gate (config check before measuring,
    float8 only where a probe passed it) and its memory headroom. DeepSeek-V3-16B's estimator ranks
    compiled layouts with recomputation first, which hit a known defect of the MoE stack."""
    from attune.campaign.tier import gate_verdict
    from attune.planners.estimates import MEMORY_HEADROOM, predict, rank_layouts
    from attune.planners.registry import make_planner
    from attune.planners.base import PlannerView
    from attune.space import config_for, lever_domains

    recipe = load_campaign_recipe(str(REPO / "recipes" / "public" / "deepseek_v3_16b.toml"), "h100:64")
    view = PlannerView(recipe=recipe, domains=lever_domains(recipe), history=[], incumbent=recipe.layout().levers(),
                       incumbent_tps=1.0, noise_band=0.01, budget_left_gpu_hours=100.0, gate_probe=lambda levers: False)
    naive = make_planner("estimator-topk-naive").propose(view).levers
    assert naive == rank_layouts(recipe)[0] and gate_verdict(recipe, naive) != (True, False)
    gated = make_planner("estimator-topk")
    for _ in range(3):
        levers = gated.propose(view).levers
        assert gate_verdict(recipe, levers) == (True, False)     # passes, no numerics change (the probe refuses)
        layout = recipe.with_config(config_for(recipe, levers)).layout()
        assert predict(recipe, layout).peak_memory_gib <= (1 - MEMORY_HEADROOM) * recipe.cluster.memory_gib
        view = PlannerView(**{**view.__dict__, "history": view.history + [_observed(recipe, levers)]})


def _observed(recipe, levers):
    from attune.planners.base import Observation
    from attune.stacks.base import TrialResult, TrialStatus
    return Observation(levers=levers, result=TrialResult(status=TrialStatus.OK, stack="sim", levers=levers, gpus=64,
                                                         wall_time_s=60, tokens_per_sec_per_gpu=1000.0))


def test_bayes_warm_starts_from_the_estimators_best_layouts_the_gate_allows(tmp_path):
    from attune.campaign.tier import gate_verdict
    from attune.planners.baselines import WARM_START
    from attune.planners.base import PlannerView
    from attune.planners.estimates import MEMORY_HEADROOM, rank_layouts
    from attune.space import lever_domains

    recipe = load_campaign_recipe(str(REPO / "recipes" / "public" / "deepseek_v3_16b.toml"), "h100:64")
    ranked = rank_layouts(recipe, headroom=MEMORY_HEADROOM)
    allowed = [ranked[i] for i in range(2000) if gate_verdict(recipe, ranked[i]) == (True, False)][:WARM_START]
    planner = make_planner("bayes-warm", seed=3)
    view = PlannerView(recipe=recipe, domains=lever_domains(recipe), history=[], incumbent=recipe.layout().levers(),
                       incumbent_tps=1.0, noise_band=0.01, budget_left_gpu_hours=100.0, gate_probe=lambda levers: False)
    asked = []
    for _ in range(WARM_START + 1):
        proposal = planner.propose(view)
        asked.append(proposal)
        view = PlannerView(**{**view.__dict__, "history": view.history + [_observed(recipe, proposal.levers)]})
    assert [p.levers for p in asked[:WARM_START]] == allowed
    assert all(p.rationale.startswith("the estimator's warm start") for p in asked[:WARM_START])
    assert asked[-1].rationale.startswith("TPE suggestion")


def test_replayed_trajectory_ends_at_the_campaigns_incumbent(tmp_path):
    c = _search(tmp_path, "attune", budget=30.0)
    points = incumbent_trajectory(c.state)
    assert len(points) == len(c.state.trials)
    assert points[-1][1] == c.state.incumbent_record.levers
    assert points[-1][0] == pytest.approx(sum(t.result.gpu_hours for t in c.state.trials))
    assert [h for h, _ in points] == sorted(h for h, _ in points)


def test_bayes_reports_invalid_layouts_as_failures():
    import optuna

    planner = make_planner("bayes", seed=0)
    recipe = load_campaign_recipe(str(RECIPE))
    from attune.planners.base import PlannerView
    from attune.space import lever_domains

    view = PlannerView(recipe=recipe, domains=lever_domains(recipe), history=[], incumbent=recipe.layout().levers(),
                       incumbent_tps=1.0, noise_band=0.01, budget_left_gpu_hours=100.0)
    assert planner.propose(view) is not None
    states = [t.state for t in planner._study.trials]
    assert states[-1] == optuna.trial.TrialState.RUNNING
    assert all(s == optuna.trial.TrialState.FAIL for s in states[:-1])   # every invalid draw told as failed


def test_gated_estimator_topk_says_it_stopped_looking_not_that_nothing_was_left(monkeypatch):
    """After max_skipped layouts the gate would refuse (none proposed between them) the planner
    gives up on a ranking it has not walked to the end: its stop reason says so, and how far it got."""
    from attune.planners import baselines
    from attune.planners.base import PlannerView
    from attune.space import lever_domains

    recipe = load_campaign_recipe(str(RECIPE))
    view = PlannerView(recipe=recipe, domains=lever_domains(recipe), history=[], incumbent=recipe.layout().levers(),
                       incumbent_tps=1.0, noise_band=0.01, budget_left_gpu_hours=100.0)
    monkeypatch.setattr(baselines, "gate_allows", lambda gate, recipe, levers: False)
    ranked = [{"layout": i} for i in range(10)]

    gave_up = baselines.EstimatorTopK(max_skipped=3, _ranked=ranked)
    assert gave_up.propose(view) is None
    assert not gave_up.stop_reason.startswith("no moves left"), gave_up.stop_reason
    assert "3 layouts" in gave_up.stop_reason and "3 of 10 ranked layouts examined" in gave_up.stop_reason

    walked = baselines.EstimatorTopK(max_skipped=30, _ranked=ranked)
    assert walked.propose(view) is None and walked.stop_reason.startswith("no moves left")


def test_sampling_planners_keep_layouts_without_a_pipeline_when_the_space_narrows_the_schedule(tmp_path, monkeypatch):
    """The seq512 CPU world searches one schedule, Interleaved1F1B; a layout without a pipeline
    records 1F1B. Random search drew only pipelined layouts there, and the warm-started TPE crashed
    on its warm start ("'1F1B' not in ('Interleaved1F1B',)")."""
    from attune.planners.base import Observation, PlannerView
    from attune.planners.registry import make_planner
    from attune.recipe import load_recipe
    from attune.space import lever_domains
    from attune.stacks.base import TrialResult, TrialStatus

    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(REPO / "benchmarks" / "cpu" / "llama3_debug_seq512.toml")
    assert lever_domains(recipe)["parallelism.pipeline_parallel_schedule"] == ["Interleaved1F1B"]
    base = recipe.layout().levers()
    ok = TrialResult(status=TrialStatus.OK, stack="sim", levers=base, gpus=2, wall_time_s=30, tokens_per_sec_per_gpu=500.0)
    for name in ("random", "bayes-warm"):
        planner, history = make_planner(name, seed=1), [Observation(levers=base, result=ok)]
        for _ in range(8):
            view = PlannerView(recipe=recipe, domains=lever_domains(recipe), history=history, incumbent=base,
                               incumbent_tps=500.0, noise_band=0.02, budget_left_gpu_hours=1.0,
                               gate_probe=lambda levers: True)
            levers = planner.propose(view).levers
            history.append(Observation(levers=levers, result=ok.model_copy(update={"levers": levers})))
        assert any(o.levers["parallelism.pipeline_parallel_degree"] == 1 for o in history[1:]), name
