"""Search rules of the `attune` planner, on the public estimator: OOM -> recompute first, no repeats,
the noise band decides the incumbent."""

from __future__ import annotations

import pytest

from attune.campaign.engine import CampaignSettings, open_campaign, record_trial
from attune.planners.base import Observation, PlannerView
from attune.planners.lesson_guided import LessonGuidedPlanner
from attune.recipe import load_recipe
from attune.space import lever_domains
from attune.stacks.base import TrialResult, TrialStatus

AC = "activation_checkpoint.mode"


def _result(recipe, levers, status=TrialStatus.OK, tps=5000.0):
    return TrialResult(status=status, stack="sim", levers=levers, gpus=recipe.cluster.gpus, wall_time_s=120,
                       tokens_per_sec_per_gpu=tps if status == TrialStatus.OK else None, mfu=0.3,
                       step_time_s=2.0, peak_memory_gib=70.0, simulated=True,
                       message="CUDA out of memory" if status == TrialStatus.OOM else "")


def _view(recipe, history, incumbent):
    return PlannerView(recipe=recipe, domains=lever_domains(recipe), history=history, incumbent=incumbent,
                       incumbent_tps=5000.0, noise_band=0.02, budget_left_gpu_hours=100.0)


def test_an_oom_layout_is_retried_with_recomputation_before_it_is_abandoned(write_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe())          # selective recomputation
    base = recipe.layout().levers()
    oomed = base | {"training.local_batch_size": 1, "compile.enable": True}
    history = [Observation(levers=base, result=_result(recipe, base), diagnosis=["memory_headroom"]),
               Observation(levers=oomed, result=_result(recipe, oomed, TrialStatus.OOM), diagnosis=["oom"])]
    proposal = LessonGuidedPlanner().propose(_view(recipe, history, base))
    assert proposal.levers == oomed | {AC: "full"}
    assert proposal.lesson_id == "oom-recompute" and "before abandoning" in proposal.rationale
    # switched off (ablation), the planner moves on instead
    other = LessonGuidedPlanner(disabled=frozenset({"oom-recompute"})).propose(_view(recipe, history, base))
    assert other is None or other.levers != oomed | {AC: "full"}


def test_a_full_recompute_oom_is_abandoned_and_never_repeated(write_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe())
    base = recipe.layout().levers()
    oomed = base | {AC: "full", "compile.enable": True}
    history = [Observation(levers=base, result=_result(recipe, base)),
               Observation(levers=oomed, result=_result(recipe, oomed, TrialStatus.OOM), diagnosis=["oom"])]
    planner = LessonGuidedPlanner()
    proposal = planner.propose(_view(recipe, history, base))
    tried = [obs.levers for obs in history]
    assert proposal is None or proposal.levers not in tried


def test_gain_inside_the_noise_band_does_not_replace_the_incumbent(write_recipe, tmp_path):
    recipe = load_recipe(write_recipe())
    c = open_campaign(recipe, CampaignSettings(budget_gpu_hours=50), home=tmp_path)
    base = recipe.layout().levers()
    for tps in (5000.0, 5100.0, 4900.0):                 # 2% spread -> band ~3.6%
        record_trial(c, "baseline", base, _result(recipe, base, tps=tps))
    band = c.state.noise_band
    assert 0.02 < band < 0.06
    small = base | {"compile.enable": True}
    record_trial(c, "trial", small, _result(recipe, small, tps=5000.0 * (1 + band / 2)))
    assert c.state.incumbent_record.role == "baseline"
    big = base | {AC: "full"}
    record_trial(c, "trial", big, _result(recipe, big, tps=5000.0 * (1 + 2 * band)))
    assert c.state.incumbent_record.levers == big
    assert c.state.budget.spent_gpu_hours == pytest.approx(0.0)  # record_trial does not charge; execute_attempt does
