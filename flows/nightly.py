"""The nightly re-tune: for each production recipe, re-tune only when something changed.

    for each recipe in the registry (deployments/production.toml):
        tonight's stack fingerprint ──► the last tuned one (recipe store, nightly ledger)
        re-measure the shipped recipe ──► slower than it shipped, beyond the noise band?
        changed or regressed ──► tune_campaign (a subflow) within the recipe's nightly budget
    a regression that no gated recipe fixed ──► markdown artifact, and the run ends Failed

A retry of the same night resumes: the re-measure is saved in the night's folder and the campaign
(seeded by the night) resumes its persisted state instead of spending the budget again.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Completed, Failed

from attune.files import attune_home
from attune.nightly import decide, shipped
from attune.nightly.ledger import NightRecord, last_record, write_record
from attune.nightly.measure import estimated_cost, shipped_recipe
from attune.nightly.registry import RegisteredRecipe, load_registry
from attune.recipe import write_recipe
from attune.store import open_store
from attune.store.entry import now_iso
from attune.campaign.inputs import load_campaign_recipe
from attune.campaign.context import CampaignSettings
from attune.flows.campaign import tune_campaign
from attune.tasks.nightly import detect_stack, nightly_summary, regression_report, remeasure_shipped, track_night


def tonight(timezone: str = "UTC") -> str:
    """The night this run is for: the scheduled start's date in the schedule's time zone."""
    from zoneinfo import ZoneInfo

    from prefect.runtime import flow_run

    when = flow_run.scheduled_start_time or dt.datetime.now(dt.timezone.utc)
    return when.astimezone(ZoneInfo(timezone)).date().isoformat()


def night_seed(seed: int, night: str) -> int:
    """Each night's campaign is its own (a new seed); a retry of the same night resumes it."""
    return seed * 100_000_000 + int(night.replace("-", ""))


@flow(name="nightly-retune", flow_run_name="nightly-{night}")
def nightly_retune(registry: str = "deployments/production.toml", night: str | None = None,
                   only: list[str] | None = None, store: str | None = None, mlflow_uri: str | None = None,
                   timezone: str = "UTC"):
    night = night or tonight(timezone)
    dt.date.fromisoformat(night)  # a bad date fails here, not in a key
    reg = load_registry(registry)
    records = [retune_one(r, night, store or reg.store, mlflow_uri or reg.mlflow_uri)
               for r in reg.selected(only)]
    nightly_summary(night, reg.path, records)
    summary = {"night": night, "recipes": [r.model_dump(mode="json") for r in records]}
    failed = [r for r in records if r.failed]
    if failed:
        what = "; ".join(f"{r.recipe}: " + (r.error or f"regressed {r.open_regression.change:+.1%}, nothing faster "
                                                         f"passed the gate") for r in failed)
        return Failed(message=f"{len(failed)} of {len(records)} recipes need attention: {what}", data=summary)
    tuned = [r.recipe for r in records if r.action == "tuned"]
    return Completed(message=f"re-tuned {', '.join(tuned)}" if tuned else "nothing changed", data=summary)


def retune_one(r: RegisteredRecipe, night: str, store_uri: str | None,
               mlflow_uri: str | None) -> NightRecord:
    store = open_store(store_uri)
    workdir = attune_home() / "nightly" / night / r.name
    last = last_record(store, r.name)
    try:
        recipe = load_campaign_recipe(r.path, r.cluster)
        stack = detect_stack(r, recipe)
        recipe = recipe.model_copy(update={"stack": stack})
        cluster, fp = recipe.cluster.label, stack.fingerprint()
        entry = shipped.last_shipped(store, recipe.model_name, cluster)
        ref = decide.reference(entry, last, cluster)
        found = decide.changes(ref, fp, stack.model_dump(exclude_none=True), recipe.model_name, cluster,
                               shipped.clusters_shipped(store, recipe.model_name))
        record = NightRecord(recipe=r.name, night=night, model=recipe.model_name, cluster=cluster, fingerprint=fp,
                             stack=stack.model_dump(exclude_none=True), changes=found,
                             reference=ref.model_dump() if ref else None, flow_run_id=_flow_run_id(),
                             tuned_fingerprint=last.tuned_fingerprint if last else None,
                             tuned_stack=last.tuned_stack if last else None, tuned_at=last.tuned_at if last else None)
    except Exception as err:  # one broken recipe must not stop the others: recorded, the run fails
        # What the last night knew (the tuned stack, a standing regression) carries over unchanged.
        carried = last.model_dump(include={"model", "cluster", "fingerprint", "stack", "tuned_fingerprint",
                                           "tuned_stack", "tuned_at", "open_regression"}) if last else {}
        record = NightRecord(**({"model": "?", "cluster": r.cluster or "?", "fingerprint": "?", "stack": {}}
                                | carried), recipe=r.name, night=night, action="failed",
                             error=f"{type(err).__name__}: {err}", why="could not check", flow_run_id=_flow_run_id())
        return _finish(store, record, mlflow_uri)
    try:
        _act(r, record, recipe, stack, entry, found, last, workdir, night, store_uri, mlflow_uri)
    except Exception as err:
        record.action, record.error = "failed", f"{type(err).__name__}: {err}"
        get_run_logger().error("%s: %s", r.name, record.error)
    return _finish(store, record, mlflow_uri)


def _act(r: RegisteredRecipe, record: NightRecord, recipe, stack, entry, found: list[str],
         last: NightRecord | None, workdir: Path, night: str, store_uri: str | None, mlflow_uri: str | None) -> None:
    """Re-measure, decide, maybe re-tune; fills `record`."""
    logger = get_run_logger()
    fp = record.fingerprint
    # re-measure what production runs: the shipped recipe, on tonight's stack
    base = recipe
    if entry is not None:
        base = shipped_recipe(entry, stack, recipe.name)
        if r.remeasure == "always" or (r.remeasure == "on_change" and found):
            if estimated_cost(r, base) <= r.budget_gpu_hours:
                record.remeasure = remeasure_shipped.with_options(tags=[f"gpu-pool:{r.pool}"])(
                    entry, base, r, str(workdir), night_seed(r.seed, night))
            else:
                logger.warning("%s: the nightly budget cannot pay for re-measuring the shipped recipe", r.name)

    tune, record.why = decide.decide(found, record.remeasure, last, fp)
    logger.info("%s: %s -> %s", r.name, record.why, "re-tune" if tune else "no re-tune")
    shipped_faster, tried = False, False
    if tune:
        record.action = "tuned"
        spent = record.remeasure.gpu_hours if record.remeasure else 0.0
        record.campaign, record.error = _campaign(r, base, workdir, night, r.budget_gpu_hours - spent,
                                                  store_uri, mlflow_uri)
        if record.error is None:  # a campaign that crashed has not tried this stack: the next night retries
            tried = True
            shipped_faster = bool(record.campaign.get("shipped"))
            record.tuned_fingerprint, record.tuned_stack, record.tuned_at = fp, record.stack, now_iso()
    record.open_regression = decide.open_regression(record.remeasure, shipped_faster, last, fp, night, tried)
    if record.open_regression is not None:
        regression_report(record)


def _campaign(r: RegisteredRecipe, base, workdir: Path, night: str, budget: float, store_uri: str | None,
              mlflow_uri: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """Run tune_campaign as a subflow; (its result, None) or (None, why it failed)."""
    if budget <= 0:
        return None, f"the re-measure spent the nightly budget ({r.budget_gpu_hours:g} GPU-hours); no campaign"
    path = write_recipe(base, workdir / "recipe.toml")
    settings = CampaignSettings.of(budget_gpu_hours=budget, stack=r.stack, planner=r.planner,
                                   seed=night_seed(r.seed, night), steps_per_trial=r.steps_per_trial,
                                   replicates=r.replicates, gate_steps=r.gate_steps, stack_options=dict(r.stack_options),
                                   planner_options=dict(r.planner_options),
                                   warm_start="auto" if r.warm_start else None)
    state = tune_campaign.with_options(flow_run_name=f"{r.name}-{night}")(
        recipe_path=str(path), settings=settings, mlflow_uri=mlflow_uri, store=store_uri, gpu_pool=r.pool,
        quiet=True, return_state=True)
    if not state.is_completed():
        return None, f"campaign ended {state.name}: {state.message or ''}".strip()
    return state.result(), None


def _finish(store, record: NightRecord, mlflow_uri: str | None) -> NightRecord:
    try:
        track_night(record, mlflow_uri)
    except Exception as err:  # tracking is for people; the ledger is what the next night reads
        get_run_logger().warning("MLflow: %s", err)
    return write_record(store, record)


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run
    return str(flow_run.id) if flow_run.id else None


@flow(name="stack-probe", persist_result=True)  # the caller reads the versions from the result
def stack_probe() -> dict[str, str]:
    """Runs on a GPU pool (deployment stack-probe/...): the versions trials there would see."""
    from attune.nightly.fingerprint import environment_versions
    return environment_versions()
