"""Search rules of the `attune` planner, on the public estimator: OOM -> recompute first, no repeats,
the noise band decides the incumbent."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import RECIPE_8B_H100

from attune.campaign.context import CampaignSettings
from attune.campaign.engine import open_campaign, record_trial
from attune.planners.base import Observation, PlannerView
from attune.planners.lesson_guided import LessonGuidedPlanner
from attune.recipe import load_recipe
from attune.space import config_for, lever_domains
from attune.stacks.base import TrialResult, TrialStatus

AC = "activation_checkpoint.mode"
# The rules that learn the cluster from what trials measured. Tests that feed made-up throughputs
# (no profiler breakdown) switch them off, so they test the rule at hand, not a model of fake data.
MODEL_RULES = frozenset({"cluster-fit", "explore", "regoal"})


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
    # the charge is saved with the record, in one write (a kill between them charged a trial twice)
    assert c.state.budget.spent_gpu_hours == pytest.approx(sum(t.result.gpu_hours for t in c.state.trials))


def test_the_margin_a_candidate_must_clear_shrinks_with_its_samples():
    from attune.campaign.noise import clears_band

    baseline = [100.0, 100.0, 100.0]              # margin z(0.9) * 2% * sqrt(1/n + 1/3)
    assert not clears_band([102.5], baseline, 0.02)          # one run: 2.96% needed
    assert clears_band([102.5, 102.5], baseline, 0.02)       # two runs: 2.34% needed
    assert not clears_band([99.0, 110.0], [], 0.02) and not clears_band([], baseline, 0.02)


def test_a_near_miss_the_estimator_expected_to_clear_is_measured_once_more(write_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe())
    base = recipe.layout().levers()
    history = [Observation(levers=base, result=_result(recipe, base), diagnosis=["low_mfu"]) for _ in range(3)]
    first = LessonGuidedPlanner().propose(_view(recipe, history, base))
    assert first is not None and first.expected_gain > 0.02   # the view's band
    near = history + [Observation(levers=first.levers, result=_result(recipe, first.levers, tps=5050.0))]  # +1%
    again = LessonGuidedPlanner().propose(_view(recipe, near, base))
    assert again.levers == first.levers and again.rationale.startswith("rule recheck")
    twice = near + [Observation(levers=first.levers, result=_result(recipe, first.levers, tps=5040.0))]
    after = LessonGuidedPlanner().propose(_view(recipe, twice, base))
    assert after is None or after.levers != first.levers                 # once, not again
    off = LessonGuidedPlanner(disabled=frozenset({"recheck"})).propose(_view(recipe, near, base))
    assert off is None or off.levers != first.levers
    lost = history + [Observation(levers=first.levers, result=_result(recipe, first.levers, tps=4900.0))]
    moved_on = LessonGuidedPlanner().propose(_view(recipe, lost, base))
    assert moved_on is None or not moved_on.rationale.startswith("rule recheck")   # a loss is not rechecked


def _best_exact_layout(recipe):
    from attune.campaign.tier import gate_verdict
    from attune.planners.estimates import rank_layouts

    ranked = rank_layouts(recipe)
    for i in range(2000):
        passes, numerics = gate_verdict(recipe, ranked[i])
        if passes and not numerics:
            return ranked[i]
    raise AssertionError("no exact-tier layout among the first 2000")


def test_float8_is_tried_only_after_the_walk_without_it_has_converged(write_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe(RECIPE_8B_H100))
    base = recipe.layout().levers()
    history = [Observation(levers=base, result=_result(recipe, base))]
    early = LessonGuidedPlanner(disabled=MODEL_RULES).propose(_view(recipe, history, base))
    assert early.levers["quantize.float8"] == "none"
    # at the estimator's best layout without float8 no exact-tier move is worth a trial: float8 opens
    top = _best_exact_layout(recipe)
    at_top = history + [Observation(levers=top, result=_result(recipe, top, tps=6000.0))]
    view = PlannerView(recipe=recipe, domains=lever_domains(recipe), history=at_top, incumbent=top,
                       incumbent_tps=6000.0, noise_band=0.02, budget_left_gpu_hours=100.0)
    late = LessonGuidedPlanner(disabled=MODEL_RULES).propose(view)
    assert late is not None and late.levers["quantize.float8"] != "none"
    assert {k for k, v in late.levers.items() if top[k] != v} >= {"quantize.float8"}


def _stuck_70b_view(tmp_path, monkeypatch) -> PlannerView:
    """Llama-3.1-70B on 64 A100s walked to TP 2 with micro-batch 1, selective AC and compile. The
    goal here is the estimator's best layout with no memory headroom asked (TP 1 with CP 2, 98% of
    memory): with MEMORY_HEADROOM the goal is predicted slower than this incumbent, and nothing jumps."""
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    monkeypatch.setattr("attune.planners.goal.MEMORY_HEADROOM", 0.0)
    recipe = load_recipe(Path(__file__).resolve().parent.parent / "recipes" / "public" / "llama3_70b.toml")
    stuck = recipe.layout().levers() | {"parallelism.tensor_parallel_degree": 2,
                                         "parallelism.data_parallel_shard_degree": 32,
                                         "training.local_batch_size": 1, AC: "selective", "compile.enable": True}
    history = [Observation(levers=recipe.layout().levers(), result=_result(recipe, recipe.layout().levers())),
               Observation(levers=stuck, result=_result(recipe, stuck, tps=6000.0))]
    return PlannerView(recipe=recipe, domains=lever_domains(recipe), history=history, incumbent=stuck,
                       incumbent_tps=6000.0, noise_band=0.02, budget_left_gpu_hours=100.0)


def test_a_walk_stuck_short_of_the_goal_jumps_to_it(tmp_path, monkeypatch):
    """From TP 2 with micro-batch 1 no single lever helps (TP 1 alone does not fit), but the
    estimator's goal, TP 1 with CP 2, is predicted better: measure it as it is."""
    view = _stuck_70b_view(tmp_path, monkeypatch)
    jump = LessonGuidedPlanner(disabled=MODEL_RULES).propose(view)
    assert jump is not None and jump.rationale.startswith("rule goal-jump") and len(jump.move) >= 2
    assert LessonGuidedPlanner(disabled=MODEL_RULES | {"goal-jump"}).propose(view) is None


def test_a_goal_the_budget_cannot_pay_ends_the_walk_saying_so(tmp_path, monkeypatch):
    """The same stuck walk with a budget that pays only for what was measured already: no jump,
    and the stop reason names the budget, not a lack of moves."""
    stuck = _stuck_70b_view(tmp_path, monkeypatch)
    tried = [obs.levers for obs in stuck.history]
    view = replace(stuck, budget_left_gpu_hours=3.0, affordable=lambda levers: levers in tried)
    planner = LessonGuidedPlanner(disabled=MODEL_RULES)
    assert planner.propose(view) is None
    assert planner.stop_reason.startswith("budget spent"), planner.stop_reason


F8 = "quantize.float8"


class _Probe:
    """A stand-in for the gate's proxy check: answers `passes` and records what it was asked."""

    def __init__(self, passes: bool):
        self.passes, self.asked = passes, []

    def __call__(self, levers):
        self.asked.append(dict(levers))
        return self.passes


def test_the_first_trial_is_the_estimators_goal_with_float8_only_if_the_probe_passes(write_recipe, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe(RECIPE_8B_H100))
    base = recipe.layout().levers()
    view = _view(recipe, [Observation(levers=base, result=_result(recipe, base)) for _ in range(3)], base)
    passing = _Probe(True)
    first = LessonGuidedPlanner().propose(replace(view, gate_probe=passing))
    assert first.rationale.startswith("rule goal-first") and len(first.move) >= 2
    assert first.levers[F8] != base[F8] and passing.asked == [first.levers] and "(probe)" in first.rationale
    refusing = _Probe(False)
    exact = LessonGuidedPlanner().propose(replace(view, gate_probe=refusing))
    assert exact.rationale.startswith("rule goal-first") and exact.levers[F8] == base[F8]
    assert len(refusing.asked) == 1 and refusing.asked[0][F8] != base[F8]   # one probe for the goal
    off = LessonGuidedPlanner(disabled=frozenset({"goal-first"})).propose(replace(view, gate_probe=passing))
    assert off is not None and not off.rationale.startswith("rule goal-first")


def test_a_float8_move_is_proposed_only_once_the_gate_has_passed_it_on_the_proxy(write_recipe, tmp_path, monkeypatch):
    from attune.planners.gate_rules import PROBE_LIMIT

    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe(RECIPE_8B_H100))
    base = recipe.layout().levers()
    top = _best_exact_layout(recipe)
    history = [Observation(levers=base, result=_result(recipe, base)),
               Observation(levers=top, result=_result(recipe, top, tps=6000.0))]
    view = replace(_view(recipe, history, top), incumbent_tps=6000.0)
    refusing = _Probe(False)
    planner = LessonGuidedPlanner()
    refused = planner.propose(replace(view, gate_probe=refusing))
    assert refused is None or refused.levers[F8] == top[F8]
    assert 1 <= len(refusing.asked) <= PROBE_LIMIT and all(a[F8] != top[F8] for a in refusing.asked)
    passing = _Probe(True)
    probed = LessonGuidedPlanner().propose(replace(view, gate_probe=passing))
    assert probed.levers[F8] != top[F8] and passing.asked[-1] == probed.levers and "(probe)" in probed.rationale


def test_the_goal_leaves_memory_headroom(tmp_path, monkeypatch):
    """A goal is reached by a jump of several levers, so it must be predicted to leave MEMORY_HEADROOM
    of memory free: on Llama-3.1-70B the estimator's best layout uses 98% and is not the goal."""
    from attune.planners import goal as goal_module
    from attune.planners.estimates import predict

    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(Path(__file__).resolve().parent.parent / "recipes" / "public" / "llama3_70b.toml")
    base = recipe.layout().levers()
    view = _view(recipe, [Observation(levers=base, result=_result(recipe, base))], base)

    def goal_memory_share(headroom: float) -> float:
        monkeypatch.setattr(goal_module, "MEMORY_HEADROOM", headroom)
        planner = LessonGuidedPlanner()
        goal = planner.goal.levers(view, planner.fit)
        layout = recipe.with_config(config_for(recipe, goal)).layout()
        return predict(recipe, layout).peak_memory_gib / recipe.cluster.memory_gib

    assert goal_memory_share(0.0) > 0.95
    assert goal_memory_share(0.10) <= 0.90


def test_the_models_measured_misses_widen_what_is_worth_a_trial(write_recipe, tmp_path, monkeypatch):
    """At the estimator's best exact layout no move is predicted to gain. If that layout measured 30%
    below its prediction, the estimator has proven unreliable on this cluster: rule explore measures
    the best-predicted moves within its doubt instead of stopping (and says so)."""
    from attune.planners.estimates import predict

    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe(RECIPE_8B_H100))
    base, top = recipe.layout().levers(), _best_exact_layout(recipe)
    tps = lambda levers: predict(recipe, recipe.with_config(config_for(recipe, levers)).layout()).tokens_per_sec_per_gpu  # noqa: E731
    history = [Observation(levers=base, result=_result(recipe, base, tps=tps(base))) for _ in range(3)]
    history.append(Observation(levers=top, result=_result(recipe, top, tps=tps(top) / 1.3)))
    view = replace(_view(recipe, history, top), incumbent_tps=tps(top) / 1.3, gate_probe=lambda levers: False)
    confident = LessonGuidedPlanner(disabled=MODEL_RULES)
    assert confident.propose(view) is None
    explorer = LessonGuidedPlanner(disabled=frozenset({"cluster-fit", "regoal"}))
    explored = explorer.propose(view)
    assert explored is not None and "explored: within the model's measured error" in explored.rationale
    assert explored.expected_gain <= view.noise_band / 2 and explorer.model.misses == [pytest.approx(0.3)]


def test_after_the_estimators_goal_misses_the_refitted_model_recovers():
    """DeepSeek-V3-16B on 64 H100s, sibling 2 of the hard world, whose inter-node fabric is 3x
    slower than modelled: the estimator's goal (no expert parallelism, FSDP over all experts across
    nodes) measures a third below the baseline. Refitted to that trial the planner's next layout is
    the cluster's best (the oracle's throughput), and its rationale names the slow fabric. Rule
    regoal jumps to the refitted goal when one-lever moves cannot reach it; here one can."""
    from attune.planners.goal import predicted_gain
    from attune.sim.oracle import oracle, truth_tps
    from attune.stacks.sim import SimStack

    recipe = load_recipe(Path(__file__).resolve().parent.parent / "benchmarks" / "recipes" / "deepseek_v3_16b_h100x64.toml")
    stack = SimStack(cluster_seed=2, world="hard")
    base = recipe.layout().levers()
    history = [Observation(levers=base, result=stack.run_trial(recipe, 10, s)) for s in range(3)]
    view = PlannerView(recipe=recipe, domains=lever_domains(recipe), history=history, incumbent=base,
                       incumbent_tps=history[0].result.tokens_per_sec_per_gpu, noise_band=0.03,
                       budget_left_gpu_hours=100.0, gate_probe=lambda levers: True)
    first = LessonGuidedPlanner(disabled=frozenset({"cluster-fit"})).propose(view)   # the estimator's own goal
    assert first.rationale.startswith("rule goal-first")
    trial = recipe.with_config(config_for(recipe, first.levers))
    history = history + [Observation(levers=first.levers, result=stack.run_trial(trial, 10, 7))]
    assert history[-1].result.tokens_per_sec_per_gpu < 0.8 * view.incumbent_tps
    planner = LessonGuidedPlanner()
    after = replace(view, history=history)
    nxt = planner.propose(after)
    assert "net_slow x" in nxt.rationale
    chosen = recipe.with_config(config_for(recipe, nxt.levers))
    best = oracle(recipe, cluster_seed=2, world="hard").best.tokens_per_sec_per_gpu
    assert truth_tps(chosen, chosen.layout(), 2, "hard") == pytest.approx(best, rel=0.01)
    # regoal's condition: the refitted goal is measured when it beats the best one-lever move by the floor
    goal, incumbent = planner.goal.levers(after, planner.fit), recipe.layout()
    gain = predicted_gain(planner.fit, recipe, incumbent, goal)
    tried = [o.levers for o in history]
    jumped = planner.goal.regoal(after, planner.fit, incumbent, tried, 0.015, best_move=gain - 0.05)
    assert jumped.rationale.startswith("rule regoal") and jumped.levers == goal
    assert planner.goal.regoal(after, planner.fit, incumbent, tried, 0.015, best_move=gain) is None
