"""Prefect tasks of the campaign: thin wrappers over attune.campaign (retries, tags, artifacts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from attune.campaign import engine, finish, gate_runs
from attune.campaign.context import Campaign
from attune.campaign.engine import RETRYABLE
from attune.campaign.report import report_markdown
from attune.campaign.state import TrialRecord
from attune.stacks.base import TrialResult


class InfrastructureFault(Exception):
    """A crash, collective failure, hang or lost worker: worth another attempt (an OOM is not)."""

    def __init__(self, result: TrialResult):
        super().__init__(f"{result.status.value}: {result.message[:200]}")
        self.result = result


def _only_infrastructure_faults(task, task_run, state) -> bool:
    try:
        state.result()
    except InfrastructureFault:
        return True
    except Exception:
        return False
    return False


TRIAL_RETRIES = 1   # one more attempt after an infrastructure fault


@task(name="run-trial", retries=TRIAL_RETRIES, retry_delay_seconds=0, retry_condition_fn=_only_infrastructure_faults,
      cache_policy=NO_CACHE)
def run_trial(c: Campaign, role: str, levers: dict[str, Any], reserve: float = 0.0, proposal=None) -> TrialRecord:
    """One attempt of a trial, recorded and diagnosed. An infrastructure fault with a retry left is
    charged on its own and raised (Prefect retries it); the last attempt is recorded, fault or not."""
    c.attempts += 1
    result = engine.execute_attempt(c, role, levers, reserve)
    if result.status in RETRYABLE and c.attempts <= TRIAL_RETRIES:
        engine.charge_unrecorded(c, result.gpu_hours)
        raise InfrastructureFault(result)
    return engine.record_trial(c, role, levers, result, proposal, attempts=c.attempts)


@task(name="gate-probe", cache_policy=NO_CACHE)
def gate_probe(c: Campaign, levers: dict[str, Any]) -> bool:
    """The gate on the proxy for a layout the planner is about to propose (its own task run, inside
    plan-next, so the proxy's training shows in the UI)."""
    return gate_runs.probe_layout(c, levers)


@task(name="plan-next", cache_policy=NO_CACHE)
def plan_next(c: Campaign):
    return engine.next_proposal(c, gate_probe=lambda levers: gate_probe(quote(c), levers))


@task(name="correctness-gate", cache_policy=NO_CACHE, persist_result=True)
def correctness_gate(c: Campaign) -> dict[str, Any]:
    return finish.run_gate(c)


@task(name="ship", cache_policy=NO_CACHE)
def ship(c: Campaign, out_path: str | None, store_uri: str | None) -> str | None:
    path = finish.ship(c, Path(out_path) if out_path else None)
    if path is not None:
        finish.publish_to_store(c, store_uri)
    return str(path) if path else None


@task(name="update-lessons", cache_policy=NO_CACHE)
def update_lessons(c: Campaign, store_uri: str | None = None) -> int:
    return finish.update_lessons(c, store_uri)


@task(name="campaign-report", cache_policy=NO_CACHE)
def publish_report(c: Campaign, result: dict[str, Any]) -> str:
    markdown = report_markdown(c, result)
    create_markdown_artifact(markdown=markdown, key=f"campaign-{c.state.campaign_id}",
                             description=f"ATTUNE campaign {c.recipe.name}")
    return markdown
