"""The campaign flow: tune one recipe within a GPU-hour budget (reads like the design's diagram).

    recipe ──► baseline (k replicates) ──► noise band
       loop: plan ONE lever move ──► trial ──► diagnose        while budget and moves are left
    confirm incumbent (replicates) ──► correctness gate ──► ship, or keep the baseline and say why
                     ▲                        │ refused (once)
                     └── best measured layout the config check passes without a numerics change

Ctrl-C, SIGTERM or a cancel in Prefect stop it within seconds: the running trial's processes are
ended and charged, the state is saved, and StopRequested leaves the flow; the same command resumes.
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow
from prefect.states import Cancelled, Completed
from prefect.utilities.annotations import quote

from attune import interrupt
from attune.campaign import engine, finish
from attune.campaign.budget import hours_text
from attune.campaign.context import Campaign, CampaignSettings
from attune.campaign.engine import BudgetExhausted, confirm_reserve
from attune.campaign.gate_runs import gate_reserve
from attune.campaign.inputs import load_campaign_recipe
from attune.errors import InputError
from attune.recipe import dump_recipe
from attune.tracking import Tracker
from attune.flows.stopping import stop_on_cancel
from attune.tasks.campaign import correctness_gate, plan_next, publish_report, run_trial, ship, update_lessons


def _tags(c: Campaign) -> dict[str, str]:
    return {"attune.model": c.recipe.model_name, "attune.cluster": c.recipe.cluster.label,
            "attune.stack": c.settings.stack, "attune.planner": c.settings.planner,
            "attune.simulated": str(c.settings.stack == "sim").lower()}


def _progress(c: Campaign, text: str) -> None:
    if c.quiet:
        return
    left = c.state.budget.left
    print(f"[attune {c.state.campaign_id}] {text} (budget left {hours_text(left)} GPU-h)", file=sys.stderr, flush=True)


def _measure(c: Campaign, tracker: Tracker, role: str, levers: dict[str, Any], proposal=None, reserve: float = 0.0):
    """Run one trial with its retries, record, diagnose and track it; None if the budget is spent.

    Tasks get the campaign quote()d: Prefect would otherwise walk every object in its state (all
    trials so far) to look for upstream futures, a third of a sim campaign's wall time."""
    c.attempts = 0
    try:
        record = run_trial.with_options(tags=_pool_tags(c))(quote(c), role, levers, reserve, quote(proposal))
    except BudgetExhausted as spent:
        if role == "confirm":   # the search stopped for its own reason: that stays the reason a user reads
            c.state.skipped.append(f"confirmation: {spent}")
        else:
            c.state.stop_reason = c.state.stop_reason or str(spent)
        return None
    record.mlflow_run_id = tracker.log_trial(c.state.mlflow_run_id, record, dump_recipe(c.trial_recipe(levers, role)),
                                             _tags(c), extra_artifacts=_llm_artifacts(proposal))
    c.save()
    gain = ""
    if record.result.ok and c.state.baseline_tps:
        gain = f" {record.tps / (sum(c.state.baseline_tps) / len(c.state.baseline_tps)) - 1:+.1%} vs baseline"
    _progress(c, f"{role} #{record.index} {record.result.status.value} {record.tps:,.0f} tok/s/GPU{gain}"
                 f"{' — ' + proposal.rationale if proposal else ''}")
    return record


def _pool_tags(c: Campaign) -> list[str]:
    """`gpu-pool:<pool>`, which a Prefect tag concurrency limit caps: the named pool, else the stack's.
    A simulated trial holds no GPUs, so on the sim stack only a named pool tags it (each tagged task
    run asks the server for a slot: ~0.2 s per trial, half a benchmark campaign's overhead)."""
    pool = c.gpu_pool or (None if c.settings.stack == "sim" else c.settings.stack)
    return [f"gpu-pool:{pool}"] if pool else []


def _llm_artifacts(proposal) -> dict[str, str] | None:
    transcript = getattr(proposal, "transcript", None) if proposal is not None else None
    return {"llm_transcript.json": transcript} if transcript else None


@flow(name="tune-campaign")
def tune_campaign(recipe_path: str, settings: CampaignSettings, cluster: str | None = None,
                  model_spec: str | None = None, mlflow_uri: str | None = None, out: str | None = None,
                  store: str | None = None, gpu_pool: str | None = None, quiet: bool = False):
    """`settings` is what the campaign is asked (attune.campaign.context.CampaignSettings; a deployment
    passes it as a dict); the rest says where it reads and writes."""
    recipe = load_campaign_recipe(recipe_path, cluster, model_spec)
    with interrupt.stop_on_signals(), stop_on_cancel():
        c = engine.open_campaign(recipe, settings, store=store)
        try:
            if settings.warm_start == "auto" and c.settings.warm_start is None:
                c.quiet = quiet
                _progress(c, f"warm start: no finished campaign of {recipe.name} under ATTUNE_HOME or in the "
                             f"recipe store; a fresh campaign")
            return _campaign(c, recipe_path, mlflow_uri, out, store, gpu_pool, quiet)
        except interrupt.StopRequested as stop:
            c.save()
            _progress(c, f"stopped by {stop.reason}; state saved in {c.directory}, the same command resumes it")
            # Cancelled, not Failed: the user stopped it, and a cancel in the UI ends as it was asked to
            return Cancelled(message=f"stopped by {stop.reason}; the state is saved, the same command resumes it")
        finally:
            engine.close_campaign(c)


def _campaign(c: Campaign, recipe_path: str, mlflow_uri: str | None, out: str | None, store: str | None,
              gpu_pool: str | None, quiet: bool):
    c.quiet, c.gpu_pool = quiet, gpu_pool
    c.say = lambda text: _progress(c, text)
    if c.state.phase == "done" and c.state.result:
        return Completed(message=c.state.result["stop_reason"], data=c.state.result)
    tracker = Tracker(mlflow_uri)
    c.state.mlflow_run_id = tracker.campaign_run(c.state, _tags(c))
    c.save()
    if tracker.log_missing_trials(c.state.mlflow_run_id, c.state,
                                  lambda t: dump_recipe(c.trial_recipe(t.levers, t.role)), _tags(c)):
        c.save()   # trials a kill had left without their MLflow run
    for hit in finish.baseline_defects(c):
        _progress(c, f"warning: the recipe as given matches known defect {hit['id']} ({hit['source']}); "
                     f"layouts that keep it cannot ship")

    # baseline replicates -> noise band (how many: the campaign's protocol, attune.campaign.protocol)
    baseline = c.recipe.layout().levers()
    if c.state.protocol is not None and c.state.protocol.fitted and not c.state.trials:
        _progress(c, f"protocol fitted to the budget: {c.state.protocol.why}")
    if c.state.warm is not None and not c.state.trials:
        _progress(c, c.state.warm.summary())
    while c.state.phase == "baseline" and engine.wants_baseline(c):
        if _measure(c, tracker, "baseline", baseline) is None:
            break
        failure = engine.baseline_failed(c)
        if failure:
            engine.discard(c)
            raise InputError(recipe_path, failure)
    if not c.state.baseline_tps:
        engine.discard(c)
        raise InputError("--budget-gpu-hours", "too small to measure the baseline once")
    if c.state.phase == "baseline":
        spent = (c.state.stop_reason or "").startswith("budget spent")
        c.state.phase = "confirm" if spent else "search"   # no budget left to search: say so, keep the baseline
    c.save()

    # the search: one lever at a time, while budget and moves are left
    while c.state.phase == "search":
        interrupt.check()
        proposal = plan_next(quote(c))
        if proposal is None:
            break
        if _measure(c, tracker, "trial", proposal.levers, proposal, reserve=confirm_reserve(c, proposal.levers)) is None:
            break
    c.state.phase = "confirm" if c.state.phase == "search" else c.state.phase
    c.save()

    # confirm the incumbent with replicates, accept its gain only if it is real, then the
    # correctness gate decides what ships; a refused candidate falls back (once) on the best measured
    # layout the config check passes without a numerics change, which is confirmed and gated in turn
    while True:
        if c.state.phase == "confirm":
            for levers in engine.confirm_plan(c):
                if _measure(c, tracker, "confirm", levers, reserve=gate_reserve(c, levers)) is None:
                    break
            engine.settle_incumbent(c)
            c.state.phase = "gate"
            c.save()
        interrupt.check()
        if c.state.incumbent_record.role != "baseline" and c.state.gate is None:
            _progress(c, "correctness gate on the incumbent")
            correctness_gate(quote(c))
        if c.state.gate is not None and c.state.gate_mlflow_run_id is None:
            c.state.gate_mlflow_run_id = tracker.log_gate(c.state.mlflow_run_id, c.state.gate, _tags(c),
                                                          number=len(c.state.rejected))
            c.save()
        if not engine.fall_back(c):
            break
        _progress(c, "the gate refused the candidate; falling back on the best measured layout it can pass")
    interrupt.check()
    recipe_out = ship(quote(c), out, store)
    result = c.state.result or finish.campaign_result(c)  # publishing a shipped recipe computed it
    update_lessons(quote(c), store)
    report = publish_report(quote(c), result)
    tracker.finish_campaign(c.state.mlflow_run_id, result, report, c.state.gate,
                            open(recipe_out).read() if recipe_out else None)
    c.state.phase = "done"
    c.save()
    return Completed(message=result["stop_reason"], data=result)


def run_campaign_for_seed(recipe_path: str, cluster: str, budget: float, seed: int = 0) -> Any:
    """One sim campaign for seeding the leaderboard: the store entry it shipped, or None.

    The campaign publishes what it ships to the default recipe store; the entry is read back
    from there so the caller gets exactly what was stored.
    """
    from attune.store import open_store

    result = tune_campaign(recipe_path, CampaignSettings.of(budget_gpu_hours=budget, seed=seed), cluster=cluster,
                           quiet=True)
    if not result["shipped"]:
        return None
    recipe = load_campaign_recipe(recipe_path, cluster)
    return open_store(None).get(recipe.model_name, recipe.cluster.label, recipe.stack.fingerprint())
