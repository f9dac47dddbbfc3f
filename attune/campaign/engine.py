"""One campaign's steps as plain functions over its persisted state (the flow calls them in order).

    open_campaign ─► baseline replicates ─► noise band
                     loop: plan ─► run trial ─► diagnose ─► maybe new incumbent
                     confirm incumbent ─► gate ─► ship or keep the baseline ─► lessons ledger
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from attune import interrupt
from attune.campaign import protocol as proto
from attune.campaign import lessons_ledger, warm_start
from attune.campaign.budget import Budget, gpu_hours
from attune.campaign.context import Campaign, CampaignSettings
from attune.campaign.diagnosis import diagnose
from attune.campaign.gate_runs import gate_reserve, probe_layout
from attune.campaign.noise import (MIN_RELATIVE_SD, campaign_spread, clears_band, gain_is_real, pool_spreads,
                                   relative_sd, search_band)
from attune.campaign.state import CampaignState, PendingTrial, Role, TrialRecord, campaign_folder, campaign_id
from attune.campaign.tier import gate_verdict
from attune.errors import InputError
from attune.files import try_lock
from attune.levers import layout_key
from attune.planners.base import Observation, PlannerView, Proposal
from attune.planners.registry import make_planner
from attune.recipe import Recipe, dump_recipe
from attune.space import lever_domains
from attune.stacks.base import TrialResult, TrialStatus
from attune.stacks.registry import make_stack

RETRYABLE = (TrialStatus.CRASH, TrialStatus.NCCL_ERROR, TrialStatus.TIMEOUT)


class BudgetExhausted(Exception):
    pass


def protocol_of(c: Campaign) -> proto.Protocol:
    """How the campaign measures (chosen when it started; a state saved before protocols were chosen
    ran the fixed one)."""
    if c.state is not None and c.state.protocol is not None:
        return c.state.protocol
    r = c.settings.replicates
    return proto.Protocol(fitted=False, baseline_runs=r, max_baseline_runs=r, max_confirm_runs=r - 1)


def search_trials(c: Campaign) -> int:
    return len(c.state.of_role("trial"))


def confirm_reserve(c: Campaign, levers: dict[str, Any]) -> float:
    """What a search trial of these levers must leave: the confirmation runs its protocol keeps in
    reserve, and the gate, for whichever layout ends up confirmed (this one, or the incumbent when
    this one loses: a cheap trial must not spend what a dear incumbent's confirmation needs)."""
    p = protocol_of(c)
    runs = p.search_reserve_runs(search_trials(c))
    if p.fitted and runs == 0:   # nothing behind it to absorb an estimate that was too low
        return proto.UNRESERVED_MARGIN * c.estimated_cost(levers) + gate_reserve(c, levers)
    incumbent = c.state.incumbent_record
    settled = [levers] + ([incumbent.levers] if incumbent is not None and incumbent.role != "baseline" else [])
    return max(runs * c.estimated_cost(lv, "confirm") + gate_reserve(c, lv) for lv in settled)


def confirm_cost(c: Campaign, levers: dict[str, Any]) -> float:
    """What one confirmation run of a layout will cost at its full length: from what its screening
    runs measured (their start-up, their step time at the confirmation's steps), else the estimate."""
    return c.estimated_cost(levers, "confirm")


def settle_cost(c: Campaign, levers: dict[str, Any]) -> float:
    """GPU-hours a search trial of these levers adds if it wins: the confirmation runs and the gate
    that would settle it, less what settling the incumbent would have cost (nothing while the
    incumbent is the baseline, which needs neither)."""
    p = protocol_of(c)
    runs = p.max_confirm_runs if not p.fitted else min(1, p.max_confirm_runs)

    def settling(layout: dict[str, Any]) -> float:
        return runs * confirm_cost(c, layout) + gate_reserve(c, layout)

    incumbent = c.state.incumbent_record
    if incumbent is None or incumbent.role == "baseline":
        return settling(levers)
    return max(0.0, settling(levers) - settling(incumbent.levers))


def choose_protocol(c: Campaign) -> proto.Protocol:
    """The campaign's measurement protocol, from its budget and what one baseline run costs (the gate's
    runs counted from the start: on torchtitan they are paid from the same budget)."""
    baseline = c.recipe.layout().levers()
    full = c.full_steps(baseline)
    screen = min(full, proto.screen_steps(c.settings.steps_per_trial))
    screen_cost = gpu_hours(c.recipe.cluster.gpus, c.run_wall_time_s(c.trial_recipe(baseline), screen))
    return proto.choose(c.settings.budget_gpu_hours, c.settings.replicates, c.settings.steps_per_trial,
                        c.estimated_cost(baseline, "confirm"), screen_cost, gate_reserve(c, baseline),
                        mode=c.settings.protocol)  # type: ignore[arg-type]


def open_campaign(recipe: Recipe, settings: CampaignSettings, home: Path | None = None,
                  store: str | None = None) -> Campaign:
    """Resume the campaign with the same identity or start a new one (the settings validated themselves;
    what needs the stack, a budget that pays for one baseline run, is checked here). A new campaign
    whose planner reads lessons keeps a copy of the lessons ledger of `store` (the default recipe
    store where None)."""
    settings, source = warm_start.resolve(recipe, settings, home, store)
    stack = make_stack(settings.stack, **settings.stack_options)
    planner = make_planner(settings.planner, seed=settings.seed, disabled_rules=frozenset(settings.disabled_rules),
                           **settings.planner_options)
    baseline_levers = recipe.layout().levers()
    probe = Campaign(recipe, settings, None, Path(), stack, planner)  # type: ignore[arg-type]
    one_run = probe.estimated_cost(baseline_levers)   # the stack's prior: nothing is measured yet
    if one_run > settings.budget_gpu_hours:
        raise InputError("--budget-gpu-hours", f"{settings.budget_gpu_hours:g} GPU-hours is less than one baseline "
                                               f"run of this recipe (about {one_run:.2f} GPU-hours)")
    toml = dump_recipe(recipe)
    cid = campaign_id(toml, **settings.identity())
    directory = campaign_folder(recipe.name, cid, home)
    # read before the folder exists: an earlier campaign that cannot be used leaves nothing behind
    fresh = not (directory / "state.json").is_file()
    warm = warm_start.load(source, recipe) if source and fresh else None
    reads = getattr(planner, "reads_lessons", False) and "lessons" not in settings.disabled_rules
    ledger = lessons_ledger.read_store(store) if fresh and reads else None
    lock = _hold_lock(directory)
    path = directory / "state.json"
    try:
        if path.is_file():
            state = CampaignState.load(path)
            if state.pending is not None:  # the process died mid-trial: its GPUs were held, charge them
                state.budget.charge(state.pending.estimated_gpu_hours)
                state.lost_gpu_hours += state.pending.estimated_gpu_hours
                state.pending = None   # saved below, with the charge
        else:
            if ledger is not None:
                lessons_ledger.keep_snapshot(directory, ledger)
            state = CampaignState(campaign_id=cid, recipe_toml=toml, settings=settings.model_dump(mode="json"),
                                  budget=Budget(total_gpu_hours=settings.budget_gpu_hours),
                                  protocol=choose_protocol(probe),
                                  warm=warm)
    except BaseException:
        lock.close()
        raise
    campaign = Campaign(recipe, settings, state, directory, stack, planner)
    campaign.lock = lock
    campaign.ledger = lessons_ledger.load_snapshot(directory)
    campaign.save()
    return campaign


def campaign_directory(recipe: Recipe, settings: CampaignSettings, home: Path | None = None) -> Path:
    """Where the campaign of this recipe and these settings keeps its state (the same command, the
    same folder: that is how a re-run resumes)."""
    settings, _ = warm_start.resolve(recipe, settings, home)
    return campaign_folder(recipe.name, campaign_id(dump_recipe(recipe), **settings.identity()), home)


def check_resumable(recipe: Recipe, settings: CampaignSettings, home: Path | None = None,
                    store: str | None = None) -> None:
    """Refuse now, in one line, a campaign whose saved state cannot be resumed (before any server or
    flow starts)."""
    settings, source = warm_start.resolve(recipe, settings, home, store)
    path = campaign_folder(recipe.name, campaign_id(dump_recipe(recipe), **settings.identity()), home) / "state.json"
    if path.is_file():
        CampaignState.load(path)
    elif source is not None:
        warm_start.load(source, recipe)   # an earlier campaign of another model is refused now


def _hold_lock(directory: Path):
    """The campaign's lock, held until the process closes it or dies: two processes running the same
    campaign would each charge and record trials the other does not see."""
    handle = try_lock(directory / ".lock")
    if handle is None:
        raise InputError("campaign", f"{directory.name} is running in another process; wait for it to finish "
                                     f"or stop it (Ctrl-C, SIGTERM), then run the same command to resume")
    return handle


def close_campaign(campaign: Campaign) -> None:
    """Let go of the campaign's lock (another process may resume it now)."""
    if campaign.lock is not None:
        campaign.lock.close()
        campaign.lock = None


def discard(campaign: Campaign) -> None:
    """Remove a campaign that could not start (its baseline failed): nothing half-written remains."""
    close_campaign(campaign)
    shutil.rmtree(campaign.directory, ignore_errors=True)


# --- trials ------------------------------------------------------------------------------------
def execute_attempt(c: Campaign, role: Role, levers: dict[str, Any], reserve: float = 0.0) -> TrialResult:
    """Run one attempt of a trial. Saved as pending before it runs (a process that dies mid-trial is
    charged the estimate on resume); charged together with its record (record_trial) or, for an
    attempt that will be retried, on its own (charge_unrecorded). Asked to stop while it ran, it is
    charged what it ran and StopRequested is raised: there is no measurement to keep."""
    interrupt.check()
    estimate = c.estimated_cost(levers, role)
    if not c.state.budget.can_afford(estimate + reserve):
        raise BudgetExhausted(f"budget spent: the next trial needs about {estimate + reserve:.2f} GPU-hours "
                              f"(with the confirmation reserve), {c.state.budget.left:.2f} left")
    c.state.pending = PendingTrial(role=role, levers=levers, estimated_gpu_hours=estimate)
    c.save()
    index = len(c.state.trials)
    workdir = c.directory / "trials" / f"{index:03d}-{role}"
    workdir.mkdir(parents=True, exist_ok=True)
    seed = c.settings.seed * 100_003 + index * 7919 + len(c.state.pending.levers)
    result = c.stack.run_trial(c.trial_recipe(levers, role), c.trial_steps(levers, role), seed, workdir)
    if interrupt.requested():
        charge_unrecorded(c, result.gpu_hours)
        interrupt.check()
    return result


def charge_unrecorded(c: Campaign, gpu_hours: float) -> None:
    """Charge GPU-hours that leave no trial record (a stopped trial, an attempt that is retried)."""
    c.state.budget.charge(gpu_hours)
    c.state.lost_gpu_hours += max(0.0, gpu_hours)
    c.state.pending = None
    c.save()


def record_trial(c: Campaign, role: Role, levers: dict[str, Any], result: TrialResult,
                 proposal: Proposal | None = None, attempts: int = 1) -> TrialRecord:
    """The trial's record and its charge, saved in one write: a process killed before it is charged
    the estimate on resume and runs the trial again, one killed after it never runs it again."""
    recipe = c.trial_recipe(levers, role)
    symptoms = diagnose(result, recipe.layout(), recipe.cluster.node_size, recipe.cluster.memory_gib)
    parent = c.state.incumbent if role == "trial" else None
    record = TrialRecord(index=len(c.state.trials), role=role, levers=levers, config=recipe.config, result=result,
                         diagnosis=symptoms, move=proposal.move if proposal else None, parent=parent,
                         lesson_id=proposal.lesson_id if proposal else None,
                         rationale=proposal.rationale if proposal else "", attempts=attempts,
                         steps=c.trial_steps(levers, role))
    c.state.budget.charge(result.gpu_hours)
    c.state.pending = None
    c.state.trials.append(record)
    if role == "baseline":
        _after_baseline(c)
    elif role == "trial":
        _maybe_new_incumbent(c, record)
    c.save()
    return record


def _after_baseline(c: Campaign) -> None:
    ok = [t for t in c.state.of_role("baseline") if t.result.ok]
    if ok:
        c.state.incumbent = c.state.incumbent if c.state.incumbent is not None else ok[0].index
        c.state.noise_rel_sd = relative_sd([t.tps for t in ok])
        c.state.noise_band = search_band(c.state.noise_rel_sd)


def mean_tps(c: Campaign, levers: dict[str, Any]) -> float:
    values = [t.tps for t in c.state.measured(levers) if t.result.ok]
    return sum(values) / len(values) if values else 0.0


def _maybe_new_incumbent(c: Campaign, record: TrialRecord) -> None:
    """After a search trial, the incumbent is the best measured layout (attune.campaign.engine.
    best_measured)."""
    incumbent = c.state.incumbent_record
    if record.result.ok and incumbent is not None:
        best = best_measured(c.state.trials[: record.index + 1], c.state.noise_rel_sd)
        if best is not None and best != incumbent.levers:
            c.state.incumbent = max(t.index for t in c.state.trials if t.levers == best and t.role != "confirm")


def best_measured(trials: list[TrialRecord], rel_sd: float | None) -> dict[str, Any] | None:
    """The incumbent rule on the trials measured so far (also replayed by attune.bench.trajectory):
    the layout with the best mean throughput of those whose gain over the baseline clears the noise
    band, else the baseline. Measured against the baseline, not against the incumbent of the moment:
    under 11% run-to-run noise five layouts measured 5-12% above an incumbent, none by its band, and
    the campaign confirmed the first one it had found (which failed its test) while a better one
    stood measured. A lucky run can make a near-tie the incumbent; its fresh confirmation runs are
    what it is judged on."""
    runs: dict[tuple, list[float]] = {}
    baseline = None
    for t in trials:
        if t.result.ok and t.role != "confirm":
            runs.setdefault(layout_key(t.levers), []).append(t.tps)
            if t.role == "baseline":
                baseline = layout_key(t.levers)
    if baseline is None:
        return None
    sd = rel_sd if rel_sd is not None else MIN_RELATIVE_SD
    best, best_mean = baseline, float(np.mean(runs[baseline]))
    for key, values in runs.items():
        if key != baseline and float(np.mean(values)) > best_mean and clears_band(values, runs[baseline], sd):
            best, best_mean = key, float(np.mean(values))
    return dict(best)


def beats_incumbent(trials: list[TrialRecord], candidate: dict[str, Any], incumbent: dict[str, Any],
                    rel_sd: float | None) -> bool:
    """Whether the candidate's runs beat the incumbent's by more than the noise explains."""
    def samples(levers):
        return [t.tps for t in trials if t.levers == levers and t.result.ok]
    return clears_band(samples(candidate), samples(incumbent), rel_sd if rel_sd is not None else MIN_RELATIVE_SD)


def baseline_failed(c: Campaign) -> str | None:
    """Why the recipe cannot be tuned, if its own baseline did not run."""
    runs = c.state.of_role("baseline")
    if runs and not any(t.result.ok for t in runs):
        last = runs[-1].result
        return f"the recipe fails its own baseline: {last.status.value} ({last.message[:200]})"
    return None


def planner_view(c: Campaign, gate_probe: Callable[[dict[str, Any]], bool] | None = None) -> PlannerView:
    """What the planner may see: the measured trials, the budget and what a layout would cost
    (its replicates and, on torchtitan, its gate's runs), and `gate_probe`, the gate asked about a
    layout before it is measured (by default gate_runs.probe_layout; the flow passes its own
    Prefect task)."""
    incumbent = c.state.incumbent_record
    history = [Observation(levers=t.levers, result=t.result, diagnosis=[s.id for s in t.diagnosis], move=t.move)
               for t in c.state.trials]
    return PlannerView(recipe=c.recipe, domains=lever_domains(c.recipe), history=history,
                       incumbent=incumbent.levers, incumbent_tps=mean_tps(c, incumbent.levers),
                       noise_band=c.state.noise_band or 0.0, budget_left_gpu_hours=c.state.budget.left,
                       trial_cost_gpu_hours=c.estimated_cost,
                       affordable=lambda levers: c.state.budget.can_afford(
                           c.estimated_cost(levers) + confirm_reserve(c, levers)),
                       gate_probe=gate_probe or (lambda levers: probe_layout(c, levers)),
                       probed={layout_key(p["levers"]): bool(p["passed"]) for p in c.state.gate_probes},
                       noise_rel_sd=c.state.noise_rel_sd or 0.0, settle_cost=lambda levers: settle_cost(c, levers),
                       training_gpu_hours=c.training_gpu_hours(), prior=warm_start.observations(c.state.warm, c.recipe, c.settings.stack),
                       prior_sd=warm_start.prior_sd(c.state.warm) if c.state.warm else 0.0,
                       ledger=c.ledger, context=lessons_ledger.context_of(c.recipe, c.settings.stack))


def next_proposal(c: Campaign, gate_probe: Callable[[dict[str, Any]], bool] | None = None) -> Proposal | None:
    """The planner's next move, or None with state.stop_reason set."""
    if len([t for t in c.state.trials if t.role == "trial"]) >= c.settings.max_trials:
        c.state.stop_reason = f"trial cap reached ({c.settings.max_trials})"
        return None
    remeasure = _warm_remeasure(c)
    if remeasure is not None:
        return remeasure
    proposal = c.planner.propose(planner_view(c, gate_probe))
    if getattr(c.planner, "usage", None):
        c.state.llm_usage = dict(c.planner.usage)
    if proposal is None:
        c.state.stop_reason = getattr(c.planner, "stop_reason", "") or "converged: the planner has no further move"
    return proposal


def _warm_remeasure(c: Campaign) -> Proposal | None:
    """With a warm start: the earlier campaign's best layouts re-measured first (those the budget pays
    for); once they are, the map old → new is fitted and said, once."""
    warm = c.state.warm
    if warm is None or warm.map is not None:
        return None
    measured = [t.levers for t in c.state.trials]
    ran = [t.levers for t in c.state.trials if t.result.ok]
    while (levers := warm_start.next_remeasure(warm, measured, ran)) is not None:
        if c.state.budget.can_afford(c.estimated_cost(levers) + confirm_reserve(c, levers)):
            old = next(lay.tps for lay in warm.layouts if lay.levers == levers)
            return Proposal(levers=levers, rationale=f"warm start: re-measure a best layout of {warm.source} "
                                                     f"({old:,.0f} tok/s/GPU there)")
        measured.append(levers)   # not affordable: the map is fitted from what was
    warm.map = warm_start.fit_map(warm, c.state.runs_by_layout(), c.state.noise_rel_sd or 0.0)
    if c.say:
        c.say(warm.summary())
    c.save()
    return None


def wants_baseline(c: Campaign) -> bool:
    """Whether to measure another baseline run (the protocol's; a run it skips is noted with why)."""
    runs = c.state.of_role("baseline")
    baseline = c.recipe.layout().levers()
    more, why = proto.more_baseline(protocol_of(c), len(runs), [t.tps for t in runs if t.result.ok],
                                    c.state.budget.left, c.estimated_cost(baseline, "baseline"),
                                    gate_reserve(c, baseline), earlier=warm_start.baseline_spread(c.state.warm))
    if why and why not in c.state.skipped:
        c.state.skipped.append(why)
    return more


def planned_confirmations(c: Campaign) -> int:
    """How many fresh confirmation runs the incumbent gets: what the test needs at the gain at stake
    and the budget left pays (attune.campaign.protocol.confirmations; replicates - 1 where the
    protocol never sizes them). Decided once per incumbent, before any of its confirmations runs, and
    saved: a resumed campaign keeps the plan whose test it runs, and the test stays one look."""
    incumbent = c.state.incumbent_record
    protocol = protocol_of(c)
    if not protocol.fitted and protocol.confirm_up_to is None:
        return protocol.max_confirm_runs
    plan = c.state.confirm_plan
    if plan is not None and plan.get("levers") == incumbent.levers:
        return int(plan["runs"])
    base = c.state.baseline_tps
    measured = mean_tps(c, incumbent.levers)
    gain = measured / (sum(base) / len(base)) - 1 if base and measured else 0.0
    runs, why = proto.confirmations(protocol, base, gain, c.state.noise_band or 0.0, c.state.budget.left,
                                    confirm_cost(c, incumbent.levers), gate_reserve(c, incumbent.levers),
                                    rel_sd=c.state.noise_rel_sd)
    if why:
        c.state.skipped.append(why)
    c.state.confirm_plan = {"levers": incumbent.levers, "runs": runs}
    c.save()
    return runs


def confirm_plan(c: Campaign) -> list[dict[str, Any]]:
    """Fresh replicates still to run for the incumbent (none if it is the baseline): replicates - 1
    of them on the fixed protocol, whatever the search measured of it (see settle_incumbent)."""
    incumbent = c.state.incumbent_record
    if incumbent is None or incumbent.role == "baseline":
        return []
    return [incumbent.levers] * max(0, planned_confirmations(c) - len(_confirmations(c, incumbent.levers)))


def _confirmations(c: Campaign, levers: dict[str, Any]) -> list[float]:
    return [t.tps for t in c.state.measured(levers) if t.role == "confirm" and t.result.ok]


def fall_back(c: Campaign) -> bool:
    """The gate refused the incumbent (a known defect, an objective change, or float8 curves that left
    the band): make the best measured layout the config check passes without a numerics change the
    candidate instead, to be confirmed and gated in turn. Once per campaign; False when no such
    layout beat the baseline."""
    incumbent, gate = c.state.incumbent_record, c.state.gate
    if incumbent is None or incumbent.role == "baseline" or gate is None or gate.get("passed") or c.state.rejected:
        return False
    fallback = best_exact(c.state.trials, c.recipe, c.state.noise_rel_sd)
    if fallback is None or fallback == incumbent.levers:
        return False   # the refusal stands: the baseline is kept
    c.state.rejected.append({"levers": incumbent.levers, "gate": gate, "mlflow_run_id": c.state.gate_mlflow_run_id})
    c.state.gate = None
    c.state.gate_mlflow_run_id = None
    c.state.incumbent = next(t.index for t in c.state.trials if t.levers == fallback)
    c.state.phase = "confirm"
    c.save()
    return True


def best_exact(trials: list[TrialRecord], recipe: Recipe, rel_sd: float | None) -> dict[str, Any] | None:
    """The measured layout with the best mean throughput that the gate's config check passes with
    no numerics change and that beat the baseline by more than the noise (None if there is none):
    what a campaign falls back on when the gate refuses its candidate. Every planner gets it,
    whichever path its search took (also replayed by attune.bench.trajectory)."""
    baseline = next((t.levers for t in trials if t.role == "baseline"), None)
    means: dict[tuple, list[float]] = {}
    for t in trials:
        if t.result.ok and t.levers != baseline:
            means.setdefault(layout_key(t.levers), []).append(t.tps)
    for key in sorted(means, key=lambda k: -sum(means[k]) / len(means[k])):
        levers = dict(key)
        passes, numerics = gate_verdict(recipe, levers)
        if passes and not numerics and beats_incumbent(trials, levers, baseline, rel_sd):
            return levers
    return None


def settle_incumbent(c: Campaign) -> tuple[bool, float]:
    """Accept the incumbent only if its gain over the baseline is real: a one-sided t-test that its
    fresh confirmation runs beat the baseline's by more than the noise band (attune.campaign.noise).
    The search's own measurement of it is left out: it was chosen for being the best of many noisy
    measurements, so it is biased upward (the more a campaign explores, the more a noise-sized "gain"
    wins the search). Only with one replicate asked is there nothing fresh to test, and then every
    measurement counts; so too where a fitted protocol's budget paid no confirmation, and then the
    test's level is split over the layouts the search measured (attune.campaign.protocol).
    Confirmations that were planned but none ran (failed, or the budget stopped them) leave nothing
    to accept."""
    incumbent = c.state.incumbent_record
    base = c.state.baseline_tps
    if incumbent is None or incumbent.role == "baseline":
        return False, 1.0
    alpha = proto.ALPHA
    if c.settings.replicates > 1 and planned_confirmations(c) > 0:
        samples = _confirmations(c, incumbent.levers)
    else:
        # One replicate asked, or a fitted protocol whose budget paid no confirmation: the search's own
        # runs, the level split over the layouts it measured (the incumbent was the best of them)
        samples = [t.tps for t in c.state.measured(incumbent.levers) if t.result.ok and t.role != "baseline"]
        if c.settings.replicates > 1:
            alpha = proto.search_alpha(len({layout_key(t.levers) for t in c.state.of_role("trial") if t.result.ok}))
    band = c.state.noise_band or 0.0
    fresh: dict[tuple, list[float]] = {}
    every: dict[tuple, list[float]] = {}
    for t in c.state.trials:
        if t.result.ok:
            every.setdefault(layout_key(t.levers), []).append(t.tps)
            # the incumbent's search runs stay out of the spread: it won the search for being high,
            # so its fresh runs would look far from it and the spread (and with it the band) too wide
            if not (t.levers == incumbent.levers and t.role != "confirm"):
                fresh.setdefault(layout_key(t.levers), []).append(t.tps)
    # unless nothing else was run twice (one baseline run, one confirmation): then the search run is
    # the only spread there is, and the one it gives errs wide, which makes the test stricter
    spread = campaign_spread(fresh) or campaign_spread(every)
    if spread is not None and spread[1] > max(0, len(base) - 1):
        # the band from every layout the campaign ran more than once, not the baseline's runs alone: two
        # or three runs make a noisy estimate of the spread, and the band multiplies it
        band = search_band(max(spread[0], MIN_RELATIVE_SD))
    earlier = warm_start.earlier_spread(c.state.warm)
    pooled = pool_spreads(campaign_spread(fresh), earlier)
    if earlier is not None and pooled is not None:
        # the earlier campaign measured the same noise: the band from both, as the test's spread is
        band = search_band(max(pooled[0], MIN_RELATIVE_SD))
    if not samples:
        accepted, p, why = False, 1.0, "no confirmation run of the best candidate succeeded, baseline kept"
    else:
        accepted, p = gain_is_real(base, samples, alpha=alpha, margin=band, spread=spread, earlier=earlier)
        why = (f"the best candidate's gain did not clear the noise band ({band:.1%}) on confirmation (p={p:.2f}), "
               f"baseline kept")
    if not accepted:
        c.state.incumbent = c.state.of_role("baseline")[0].index
        c.state.stop_reason = (c.state.stop_reason or "") + f"; {why}"
    c.save()
    return accepted, p
