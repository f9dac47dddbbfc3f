"""The `attune` planner's one rule: the next trial is the best expected improvement per GPU-hour under
the model's own error, and the search stops when that trial is not worth its cost or the budget
cannot pay for it (attune/planners/attune_planner.py, belief.py, residual_gp.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import RECIPE_8B_H100, REPO

from attune.layout import FLOAT8
from attune.levers import layout_key
from attune.planners.attune_planner import RULES, AttunePlanner, measured_arrays
from attune.planners.base import Observation, PlannerView
from attune.planners.belief import THROUGHPUT_WIDTH, Belief
from attune.recipe import load_recipe
from attune.space import config_for, iter_layouts, lever_domains
from attune.stacks.base import TrialResult, TrialStatus

CPU_RECIPE = REPO / "benchmarks" / "cpu" / "llama3_debug_search.toml"   # 88 layouts: every one can be looked at


def _result(recipe, levers, tps, status=TrialStatus.OK, peak=None):
    return TrialResult(status=status, stack="sim", levers=levers, gpus=recipe.cluster.gpus, wall_time_s=60,
                       tokens_per_sec_per_gpu=tps if status == TrialStatus.OK else None, step_time_s=1.0,
                       peak_memory_gib=peak, simulated=True)


def _predicted(recipe, levers) -> float:
    from attune.planners.estimates import predict
    return predict(recipe, recipe.with_config(config_for(recipe, levers)).layout()).tokens_per_sec_per_gpu


def _view(recipe, history, incumbent, **extra) -> PlannerView:
    tps = np.mean([o.result.tokens_per_sec_per_gpu for o in history if o.levers == incumbent and o.result.ok])
    fields = dict(recipe=recipe, domains=lever_domains(recipe), history=history, incumbent=incumbent,
                  incumbent_tps=float(tps), noise_band=0.02, noise_rel_sd=0.01, budget_left_gpu_hours=1.0,
                  trial_cost_gpu_hours=lambda levers: 0.01, affordable=lambda levers: True,
                  training_gpu_hours=1_000.0)
    return PlannerView(**(fields | extra))


def _baseline(recipe, tps_factor=1.0, runs=3):
    base = recipe.layout().levers()
    return base, [Observation(levers=base, result=_result(recipe, base, tps_factor * _predicted(recipe, base)))
                  for _ in range(runs)]


def test_the_rules_are_the_ones_the_docstring_names():
    import attune.planners.attune_planner as module
    assert all(f"({rule})" in module.__doc__ or f"{rule}" in module.__doc__ for rule in RULES)


def test_a_near_tie_inside_the_models_error_is_measured_while_budget_is_left(tmp_path, monkeypatch):
    """The incumbent is the estimator's best layout, measured as predicted; every other layout is
    predicted slower. Where the model has proven wrong (its misses are large), the near-ties are
    measured; where it has proven right, the campaign stops, and says why in EI terms."""
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(CPU_RECIPE)
    base, history = _baseline(recipe)
    ranked = sorted((lo.levers() for lo in iter_layouts(recipe)), key=lambda lv: -_predicted(recipe, lv))
    top = next(lv for lv in ranked if lv != base)
    history = history + [Observation(levers=top, result=_result(recipe, top, _predicted(recipe, top)))]
    view = _view(recipe, history, top, training_gpu_hours=0.2)   # a trial must expect 5% to repay its 0.01
    doubtful = AttunePlanner()
    doubtful.belief.z_throughput = [3.0, -3.0, 3.0]         # misses three times its own sd: a model not to trust
    doubtful.belief._seen = len(history)
    near = doubtful.propose(view)
    assert near is not None and near.expected_gain < 0 and "EI +" in near.rationale
    sure = AttunePlanner()
    sure.belief.z_throughput = [0.05] * 20                   # a model that kept proving right
    sure.belief._seen = len(history)
    assert sure.propose(view) is None
    assert sure.stop_reason.startswith("converged: the best remaining trial, ")
    assert "expects +" in sure.stop_reason and "less than it costs" in sure.stop_reason


def test_the_budget_stops_only_when_no_trial_worth_it_is_affordable(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(CPU_RECIPE)
    base, history = _baseline(recipe)
    planner = AttunePlanner()
    first = planner.propose(_view(recipe, history, base))
    assert first is not None
    # the best-valued trial is too dear: the next affordable one is proposed instead
    dearer = AttunePlanner().propose(_view(recipe, history, base, affordable=lambda lv: lv != first.levers))
    assert dearer is not None and dearer.levers != first.levers
    broke = AttunePlanner()
    assert broke.propose(_view(recipe, history, base, affordable=lambda lv: False)) is None
    assert broke.stop_reason.startswith("budget spent: the best remaining trial, ")
    assert "GPU-hours left" in broke.stop_reason


def test_no_layout_is_proposed_twice_and_the_config_check_is_never_overruled(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    from attune.campaign.tier import gate_verdict
    recipe = load_recipe(CPU_RECIPE)
    base, history = _baseline(recipe)
    planner = AttunePlanner()
    seen = {layout_key(base)}
    for _ in range(6):
        proposal = planner.propose(_view(recipe, history, base))
        assert proposal is not None and layout_key(proposal.levers) not in seen
        assert gate_verdict(recipe, proposal.levers)[0]
        seen.add(layout_key(proposal.levers))
        history = history + [Observation(levers=proposal.levers,
                                         result=_result(recipe, proposal.levers, 0.5 * _predicted(recipe, base)))]


def test_float8_is_proposed_only_after_the_proxy_passed_it(write_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(write_recipe(RECIPE_8B_H100))
    base, history = _baseline(recipe)
    asked = []
    refused = AttunePlanner().propose(_view(recipe, history, base, gate_probe=lambda lv: asked.append(lv) or False))
    assert refused is not None and refused.levers[FLOAT8] == base[FLOAT8]
    assert asked and all(lv[FLOAT8] != base[FLOAT8] for lv in asked)
    passed = AttunePlanner().propose(_view(recipe, history, base, gate_probe=lambda lv: True))
    assert passed.levers[FLOAT8] != base[FLOAT8] and "(probe)" in passed.rationale


def test_the_belief_is_calibrated_out_of_sample(tmp_path, monkeypatch):
    """Replicates of one layout predict nothing; a new layout measured 30% off a model that expected
    a 20% sd is a miss of about 1.5 sd, and widens the belief; one measured as predicted narrows it."""
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(CPU_RECIPE)
    base, history = _baseline(recipe)
    belief = Belief(fitted=False)
    belief.update(recipe, history, 0.01)
    assert belief.z_throughput == [] and belief.throughput_width == pytest.approx(THROUGHPUT_WIDTH)
    far = next(lo.levers() for lo in iter_layouts(recipe) if lo.levers()["parallelism.pipeline_parallel_degree"] == 2)
    wrong = history + [Observation(levers=far, result=_result(recipe, far, 0.5 * _predicted(recipe, far)))]
    belief.update(recipe, wrong, 0.01)
    assert len(belief.z_throughput) == 1 and belief.z_throughput[0] < -2.5
    assert belief.throughput_width > THROUGHPUT_WIDTH
    right = Belief(fitted=False)
    right.update(recipe, history + [Observation(levers=far, result=_result(recipe, far, _predicted(recipe, far)))], 0.01)
    assert abs(right.z_throughput[0]) < 0.1 and right.throughput_width < THROUGHPUT_WIDTH


def test_a_measured_layout_tells_its_neighbours_more_than_far_layouts(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(CPU_RECIPE)
    base, history = _baseline(recipe, tps_factor=2.0)          # twice what the model says
    layouts = [lo.levers() for lo in iter_layouts(recipe)]
    near = next(lv for lv in layouts if sum(lv[k] != base[k] for k in base) == 1)
    far = max(layouts, key=lambda lv: sum(lv[k] != base[k] for k in base))
    belief = Belief(fitted=False)
    belief.update(recipe, history, 0.01)
    from attune.planners.residual_gp import features
    arrays = measured_arrays(recipe, [near, far])
    mean, sd = belief.throughput(recipe, history, arrays, features(arrays), 0.01)
    model = np.log([_predicted(recipe, near), _predicted(recipe, far)])
    assert mean[0] - model[0] > mean[1] - model[1] > -1e-9       # the near one inherits more of the +log 2
    assert sd[0] < sd[1]
    independent = Belief(fitted=False, correlated=False)
    mean_i, _ = independent.throughput(recipe, history, arrays, features(arrays), 0.01)
    assert mean_i == pytest.approx(model, abs=1e-4)


def test_an_out_of_memory_run_warns_its_neighbours(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    from attune.planners.residual_gp import features
    recipe = load_recipe(REPO / "benchmarks" / "cpu" / "llama3_debug_search_tight.toml")
    base, history = _baseline(recipe)
    history = [replace(o, result=o.result.model_copy(update={"peak_memory_gib": 0.70})) for o in history]
    layouts = [lo.levers() for lo in iter_layouts(recipe)]
    oomed = next(lv for lv in layouts if lv["parallelism.data_parallel_replicate_degree"] == 2
                 and lv["activation_checkpoint.mode"] == "none" and lv["training.local_batch_size"] == 4
                 and not lv["compile.enable"])
    sibling = oomed | {"compile.enable": True}
    belief = Belief()
    belief.update(recipe, history, 0.01)
    arrays = measured_arrays(recipe, [sibling])
    before, _ = belief.memory(recipe, history, arrays, features(arrays))
    after_oom = history + [Observation(levers=oomed, result=_result(recipe, oomed, None, TrialStatus.OOM))]
    belief.update(recipe, after_oom, 0.01)
    after, _ = belief.memory(recipe, after_oom, arrays, features(arrays))
    assert after[0] > before[0] and np.exp(after[0]) > 0.95 * recipe.cluster.memory_gib


def test_cost_aware_takes_the_cheaper_of_two_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    recipe = load_recipe(CPU_RECIPE)
    base, history = _baseline(recipe)
    first = AttunePlanner().propose(_view(recipe, history, base))
    dear = lambda levers: 1.0 if levers == first.levers else 0.01    # noqa: E731
    cheaper = AttunePlanner().propose(_view(recipe, history, base, trial_cost_gpu_hours=dear))
    assert cheaper.levers != first.levers
    blind = AttunePlanner(disabled=frozenset({"cost-aware"})).propose(_view(recipe, history, base,
                                                                            trial_cost_gpu_hours=dear))
    assert blind.levers == first.levers


def test_a_lesson_shifts_the_layouts_that_make_its_move(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    from attune.lessons.catalog import load_lessons
    recipe = load_recipe(CPU_RECIPE)
    base, history = _baseline(recipe)
    history = [replace(o, diagnosis=["exposed_comm_fsdp"]) for o in history]
    planner = AttunePlanner()
    planner.belief.update(recipe, history, 0.01)
    from attune.planners.attune_planner import Space
    space = Space.of(recipe)
    priors = planner._lesson_priors(_view(recipe, history, base), space.arrays, measured_arrays(recipe, [base]))
    matching = [lesson for lesson in load_lessons() if "exposed_comm_fsdp" in lesson.when.symptoms]
    assert priors and {p.lesson for p in priors} <= {lesson.id for lesson in matching}
    assert all(p.where.any() and not p.where_measured.any() for p in priors)   # the baseline does not make the move
    assert AttunePlanner(disabled=frozenset({"lessons"}))._lesson_priors(
        _view(recipe, history, base), space.arrays, measured_arrays(recipe, [base])) == []
    # campaigns in this context that found one of these moves useless: its prior sinks, the others stay
    from attune.campaign.lessons_ledger import context_of
    from attune.lessons.ledger import CampaignMoves, Move
    from attune.levers import lever
    target = next(lesson for lesson in matching if lesson.id == priors[0].lesson)
    values = list(lever(target.try_.lever).values) or [1, 2]
    before, after = (values[0], target.try_.value) if target.try_.direction == "set" else (
        (values[0], values[1]) if target.try_.direction == "up" else (values[1], values[0]))
    useless = [CampaignMoves(campaign=f"c{i}", at="", model="m", context=context_of(recipe, "sim"),
                             moves=[Move(changes={target.try_.lever: (before, after)}, symptoms=["exposed_comm_fsdp"],
                                         gain=-0.08, sd=0.02)]) for i in range(5)]
    learned = planner._lesson_priors(_view(recipe, history, base, ledger=useless, context=context_of(recipe, "sim")),
                                     space.arrays, measured_arrays(recipe, [base]))
    shifts = {p.lesson: p.shift for p in learned}
    assert shifts[target.id] < min(0.0, priors[0].shift) and "over 5 campaigns" in learned[0].text
    assert all(shifts[p.lesson] == p.shift for p in priors if p.lesson != target.id)
