"""What a run costs is learned from the campaign's runs (attune/campaign/costs.py), a single baseline
run never passes a noise-sized gain, and the stop reason a user reads is the one that stopped it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from attune.campaign import engine
from attune.campaign.context import CampaignSettings
from attune.campaign.costs import REPEAT_MARGIN, MeasuredRun, TrialCosts
from attune.campaign.noise import campaign_spread, gain_is_real
from attune.recipe import load_recipe
from attune.space import iter_layouts, recipe_at
from attune.stacks.measured import MeasuredStack

RECIPE = REPO / "benchmarks" / "cpu" / "llama3_debug_search.toml"
TABLE = REPO / "benchmarks" / "cpu" / "sweep-cpu2-2026-12-06.jsonl"
COMPILE = "compile.enable"


def _prior(fixed: float, per_step: float, compile_extra: float = 0.0):
    return lambda recipe, steps: fixed + (compile_extra if recipe.layout().compile else 0.0) + steps * per_step


def test_a_prior_five_times_too_high_prices_every_layout_after_one_run():
    recipe = load_recipe(RECIPE)
    base = recipe.layout().levers()
    other = next(lo.levers() for lo in iter_layouts(recipe) if lo.levers() != base and not lo.compile)
    compiled = base | {COMPILE: True}
    costs = TrialCosts(prior=_prior(100.0, 5.0, compile_extra=500.0), recipe=recipe)
    costs.learn([])
    assert costs.wall_time_s(recipe_at(recipe, other), 10) == pytest.approx(150.0)     # the prior, before any run
    costs.learn([MeasuredRun(levers=base, steps=5, wall_time_s=25.0, step_time_s=1.0)])   # fixed 20 s, 1 s a step
    assert costs.wall_time_s(recipe_at(recipe, other), 10) == pytest.approx(100 * 0.2 + 10 * 5 * 0.2)
    # the layout measured: priced at the confirmation's full length from its screening run
    assert costs.wall_time_s(recipe_at(recipe, base), 10) == pytest.approx(REPEAT_MARGIN * (20.0 + 10 * 1.0))
    # compile's start-up, 100x the truth in its prior: the other setting's ratio until one is measured
    assert costs.wall_time_s(recipe_at(recipe, compiled), 10) == pytest.approx(600 * 0.2 + 10)
    # an out-of-memory compile run ends after its start-up: that teaches it
    costs.learn([MeasuredRun(levers=base, steps=5, wall_time_s=25.0, step_time_s=1.0),
                 MeasuredRun(levers=compiled | {"training.local_batch_size": 4}, steps=0, wall_time_s=30.0,
                             step_time_s=0.0)])
    assert costs.wall_time_s(recipe_at(recipe, compiled), 10) == pytest.approx(600 * 0.05 + 10)
    # a prior too low raises every estimate after the first run: the budget is not overrun
    low = TrialCosts(prior=_prior(10.0, 0.5), recipe=recipe)
    low.learn([MeasuredRun(levers=base, steps=5, wall_time_s=25.0, step_time_s=1.0)])
    assert low.wall_time_s(recipe_at(recipe, other), 10) == pytest.approx(2 * (10 + 10 * 0.5))   # twice the prior


class _Overpriced(MeasuredStack):
    """The measured stack, with a prior five times what its runs truly cost."""

    def estimate_wall_time_s(self, recipe, steps):
        runs = self.table.runs(recipe.layout().levers())
        tps = [t for r in runs for t in r.get("step_tps") or [] if t]
        step = recipe.layout().tokens_per_step / recipe.cluster.gpus / float(np.median(tps)) if tps else 1.0
        startup = float(np.mean([r["wall_time_s"] for r in runs])) - 6 * step
        return 5.0 * (startup + (2 + steps) * step)


def _campaign(recipe_path, settings, home, stack, monkeypatch):
    """The campaign flow's loop on the engine's functions, without Prefect: baseline, search, stop."""
    monkeypatch.setattr(engine, "make_stack", lambda name, **options: stack)
    recipe = load_recipe(recipe_path)
    c = engine.open_campaign(recipe, settings, home)
    base = recipe.layout().levers()
    while engine.wants_baseline(c):
        engine.record_trial(c, "baseline", base, engine.execute_attempt(c, "baseline", base))
    c.state.phase = "search"
    while (proposal := engine.next_proposal(c)) is not None:
        try:
            result = engine.execute_attempt(c, "trial", proposal.levers, engine.confirm_reserve(c, proposal.levers))
        except engine.BudgetExhausted as spent:
            c.state.stop_reason = str(spent)
            break
        engine.record_trial(c, "trial", proposal.levers, result, proposal)
    engine.close_campaign(c)
    return c


def test_a_campaign_whose_priors_are_five_times_its_costs_does_not_stop_while_the_budget_pays(tmp_path, monkeypatch):
    """At the prior, one run of the baseline costs a fifth of the budget and the search could not pay
    a trial with its confirmation; at the costs the campaign measures, it pays a dozen. The campaign
    stops for budget only when what is left cannot pay the trial it wanted at those costs."""
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    stack = _Overpriced(table=str(TABLE))
    budget = 0.25
    recipe = load_recipe(RECIPE)
    prior_run = recipe.cluster.gpus * stack.estimate_wall_time_s(recipe, 10) / 3600
    assert 3 * prior_run > 0.6 * budget   # at its prior, a baseline, a trial and a confirmation take most of it
    settings = CampaignSettings.of(budget_gpu_hours=budget, stack="measured", stack_options={"table": str(TABLE)})
    c = _campaign(RECIPE, settings, tmp_path, stack, monkeypatch)
    runs = [t.result.gpu_hours for t in c.state.trials if t.result.ok]
    assert len(c.state.of_role("trial")) >= 6
    if c.state.stop_reason.startswith("budget spent"):
        most = max(runs)
        assert c.state.budget.left < 2 * REPEAT_MARGIN * most + 1e-9   # a trial and its confirmation, as measured
    # what it learned survives a resume: a new process prices the baseline from the runs in the state
    again = engine.open_campaign(recipe, settings, tmp_path)
    base = recipe.layout().levers()
    assert again.estimated_cost(base, "confirm") < 0.5 * prior_run
    engine.close_campaign(again)


def test_one_baseline_run_never_passes_a_noise_sized_gain_on_a_noisy_cluster():
    """5% run-to-run noise, one baseline run, a candidate no faster: with the old assumed 2% floor
    the confirmation test passed such a candidate about one time in ten; now it needs a spread the
    campaign measured, and at its level it passes at most alpha of them."""
    rng = np.random.default_rng(7)
    passed_floor = passed = 0
    trials = 2000
    for _ in range(trials):
        base = [1000 * np.exp(rng.normal(0, 0.05))]
        search, confirm = (1000 * np.exp(rng.normal(0, 0.05)) for _ in range(2))
        assert not gain_is_real(base, [confirm], margin=0.0)[0]       # no spread measured: never
        spread = campaign_spread({"candidate": [search, confirm]})
        passed += gain_is_real(base, [confirm], margin=0.0, spread=spread)[0]
        passed_floor += np.log(confirm / base[0]) > 1.645 * 0.02 * np.sqrt(2)   # the old floor's band test
    assert passed_floor / trials > 0.08
    assert passed / trials <= 0.065


def test_the_stop_reason_is_the_one_that_stopped_the_search(tmp_path, monkeypatch):
    """A search that converged, whose confirmation the budget could not pay: the user reads why the
    search stopped, and the skipped confirmation beside it, never "budget spent" in its place."""
    from attune.campaign.state import CampaignState
    from flows import campaign as flow

    state = CampaignState(campaign_id="x", recipe_toml="", settings={}, budget={"total_gpu_hours": 1.0},
                          stop_reason="converged: the best remaining trial expects +0.01%")

    class _C:
        pass

    c = _C()
    c.state = state

    def spent(*args, **kwargs):
        raise engine.BudgetExhausted("budget spent: the next trial needs about 0.5 GPU-hours")

    monkeypatch.setattr(flow, "run_trial", type("T", (), {"with_options": lambda self, **kw: spent})())
    monkeypatch.setattr(flow, "_pool_tags", lambda c: [])
    assert flow._measure(c, tracker=None, role="confirm", levers={}) is None
    assert state.stop_reason.startswith("converged") and "confirmation: budget spent" in state.skipped[0]


def test_compiles_cpu_prior_does_not_price_a_compile_trial_out_of_the_cpu_benchmarks_budget(tmp_path, monkeypatch):
    """torchtitan's CPU compile prior is a cold inductor cache's start-up; the sweeps measured a warm
    one a second or two over eager. After the baseline's eager runs, a compile trial with the two
    confirmations the fixed protocol keeps behind it must fit the CPU benchmark's 0.25 process-hours
    (at the old 150 s prior with no learning it did not, so no campaign there ever compiled)."""
    monkeypatch.setenv("ATTUNE_HOME", str(tmp_path))
    settings = CampaignSettings.of(budget_gpu_hours=0.25, stack="measured", stack_options={"table": str(TABLE)})
    stack = MeasuredStack(table=str(TABLE))
    monkeypatch.setattr(engine, "make_stack", lambda name, **options: stack)
    recipe = load_recipe(RECIPE)
    c = engine.open_campaign(recipe, settings, tmp_path)
    base = recipe.layout().levers()
    compiled = base | {COMPILE: True}
    while engine.wants_baseline(c):
        engine.record_trial(c, "baseline", base, engine.execute_attempt(c, "baseline", base))
    assert c.estimated_cost(compiled) + 2 * c.estimated_cost(compiled, "confirm") < 0.5 * 0.25
    engine.close_campaign(c)


def test_a_warm_start_prices_its_first_compiled_layout_at_the_earlier_campaigns_start_up():
    """Compile's prior is 100x its truth here; the earlier campaign ran a compiled layout (start-up 30 s
    against 600 s in the prior): a warm-started campaign prices compiled layouts from that before it
    runs one itself, and its own runs still decide its step time."""
    recipe = load_recipe(RECIPE)
    base = recipe.layout().levers()
    compiled = base | {COMPILE: True}
    earlier = [MeasuredRun(levers=compiled, steps=5, wall_time_s=80.0, step_time_s=10.0)]   # fixed 30 s
    cold, warm = (TrialCosts(prior=_prior(100.0, 5.0, compile_extra=500.0), recipe=recipe) for _ in range(2))
    own = [MeasuredRun(levers=base, steps=5, wall_time_s=25.0, step_time_s=1.0)]
    cold.learn(own)
    warm.learn(own, earlier)
    assert cold.wall_time_s(recipe_at(recipe, compiled), 10) == pytest.approx(600 * 0.2 + 10)
    # the largest start-up ratio of compiled runs: the earlier one's (0.05), the step part from this campaign
    assert warm.wall_time_s(recipe_at(recipe, compiled), 10) == pytest.approx(600 * 0.05 + 10)
