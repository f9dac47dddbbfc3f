"""Prefect tasks of the nightly re-tune: thin wrappers over attune.nightly (tags, artifacts, MLflow)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from attune.nightly import fingerprint, measure, report
from attune.nightly.ledger import NightRecord
from attune.nightly.regression import Remeasure
from attune.nightly.registry import RegisteredRecipe
from attune.recipe import Recipe
from attune.spec import StackSpec
from attune.store import StoreEntry


@task(name="detect-stack", cache_policy=NO_CACHE)
def detect_stack(registered: RegisteredRecipe, recipe: Recipe) -> StackSpec:
    """Tonight's versions. With a probe deployment they are read on the GPU pool itself (the
    orchestrating worker may run another image than the trials); else in this process."""
    versions = None
    if registered.stack != "sim" and registered.probe_deployment:
        from prefect.deployments import run_deployment

        run = run_deployment(registered.probe_deployment, timeout=1800, as_subflow=True)
        if run.state is None or not run.state.is_completed():
            raise RuntimeError(f"stack probe {registered.probe_deployment} ended "
                               f"{run.state.name if run.state else 'unknown'}")
        versions = run.state.result()
    return fingerprint.detect_stack(registered.stack, recipe, versions)


@task(name="remeasure-shipped", cache_policy=NO_CACHE)
def remeasure_shipped(entry: StoreEntry, recipe: Recipe, registered: RegisteredRecipe, workdir: str,
                      seed: int) -> Remeasure:
    # Tagged gpu-pool:<pool> by the flow: the re-measure holds the pool like any trial does.
    return measure.remeasure(entry, recipe, registered, Path(workdir), seed)


@task(name="regression-report", cache_policy=NO_CACHE)
def regression_report(record: NightRecord) -> str:
    markdown = report.regression_markdown(record)
    create_markdown_artifact(markdown=markdown, key=artifact_key("nightly-regression", record.recipe),
                             description=f"ATTUNE regression: {record.recipe} {record.remeasure.change:+.1%}")
    return markdown


@task(name="nightly-summary", cache_policy=NO_CACHE)
def nightly_summary(night: str, registry: str, records: list[NightRecord]) -> str:
    markdown = report.summary_markdown(night, registry, records)
    create_markdown_artifact(markdown=markdown, key="nightly-retune", description=f"ATTUNE nightly {night}")
    return markdown


@task(name="track-night", cache_policy=NO_CACHE)
def track_night(record: NightRecord, mlflow_uri: str | None) -> str:
    """One MLflow run per recipe per night (experiment attune-nightly), linked to the campaign's run."""
    import time

    from mlflow.entities import Metric, RunTag

    from attune.tracking import Tracker

    tracker = Tracker(mlflow_uri, experiment="attune-nightly")
    # MLflow 3 opens an experiment without a kind as a GenAI app; these are measurements.
    tracker.client.set_experiment_tag(tracker.experiment_id, "mlflow.experimentKind", "custom_model_development")
    tags = {"attune.recipe": record.recipe, "attune.night": record.night, "attune.model": record.model,
            "attune.cluster": record.cluster, "attune.fingerprint": record.fingerprint,
            "attune.action": record.action, "attune.regression": str(record.open_regression is not None).lower(),
            "attune.why": record.why[:4000]}
    if record.campaign and record.campaign.get("mlflow_run_id"):
        tags["attune.campaign_run"] = str(record.campaign["mlflow_run_id"])
    run = tracker.client.create_run(tracker.experiment_id, run_name=f"{record.recipe}-{record.night}", tags=tags)
    now = int(time.time() * 1000)
    m = record.remeasure
    values: dict[str, Any] = {}
    if m is not None:
        values = {"remeasured_tokens_per_sec_per_gpu": m.mean_tps, "shipped_tokens_per_sec_per_gpu": m.reference_tps,
                  "change": m.change, "noise_band": m.band, "remeasure_gpu_hours": m.gpu_hours}
    if record.campaign:
        values |= {"campaign_gain": record.campaign.get("gain"),
                   "campaign_gpu_hours": record.campaign.get("gpu_hours_used")}
    metrics = [Metric(k, float(v), now, 0) for k, v in values.items() if isinstance(v, (int, float))]
    tracker.client.log_batch(run.info.run_id, metrics=metrics,
                             tags=[RunTag("attune.stack." + k, v) for k, v in record.stack.items()])
    tracker.client.log_text(run.info.run_id, record.model_dump_json(indent=1), "night.json")
    tracker.client.set_terminated(run.info.run_id, "FAILED" if record.failed else "FINISHED")
    return run.info.run_id


def artifact_key(prefix: str, name: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return f"{prefix}-{re.sub(r'[^a-z0-9-]+', '-', name.lower())}".strip("-")
