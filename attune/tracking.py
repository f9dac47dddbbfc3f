"""MLflow at the edge: a campaign is a parent run, each trial a nested run.

Defaults need no server: a SQLite file under $ATTUNE_HOME (mlflow.db) with artifacts beside it;
`--mlflow-uri` (or MLFLOW_TRACKING_URI) points at a real server. Uses MlflowClient directly: no
global active-run state, one batched call per trial's params and metrics.

A campaign killed between saving a trial and logging it resumes by logging what is missing: every
run carries the campaign's id and its trial's index as tags, so a run logged before the kill (its
id never saved) is found and kept, and one cut off half-way is deleted and logged again. One run
per trial, whenever the process died.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attune.campaign.state import CampaignState, TrialRecord
from attune.files import attune_home, locked

EXPERIMENT = "attune-campaigns"
SECRET_MARKERS = ("KEY", "SECRET", "TOKEN", "PASSWORD")


def default_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{attune_home() / 'mlflow.db'}"


def _client(uri: str):
    import logging

    from mlflow.tracking import MlflowClient
    # "Creating initial MLflow database tables..." on every new file: MLflow's news, not the user's
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


class Tracker:
    def __init__(self, uri: str | None = None, experiment: str = EXPERIMENT):
        self.uri = uri or default_uri()
        # against a tracking server MLflow prints each run's URL on stdout, where --json output goes
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        if self.uri.startswith("sqlite:///"):
            # two first campaigns on one new file both create MLflow's tables; one would die with
            # "table ... already exists": the first to hold the lock creates them, the other finds them
            database = Path(self.uri.removeprefix("sqlite:///"))
            database.parent.mkdir(parents=True, exist_ok=True)
            with locked(database.with_name(database.name + ".lock")):
                self._open(experiment)
        else:
            self._open(experiment)

    def _open(self, experiment: str) -> None:
        self.client = _client(self.uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            artifacts = None
            if self.uri.startswith("sqlite:///"):
                artifacts = (Path(self.uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
            # Without a kind tag MLflow 3 opens the experiment as a GenAI overview, not a run table.
            self.experiment_id = self.client.create_experiment(
                experiment, artifact_location=artifacts, tags={"mlflow.experimentKind": "custom_model_development"})
        else:
            self.experiment_id = found.experiment_id

    def _find(self, filter_string: str) -> list:
        return self.client.search_runs([self.experiment_id], filter_string=filter_string, max_results=1000)

    def campaign_run(self, state: CampaignState, tags: dict[str, str]) -> str:
        """The campaign's parent run: resumed when the state already names one, or found by the
        campaign's id when the process died before saving its id."""
        if state.mlflow_run_id:
            return state.mlflow_run_id
        for run in self._find(f"tags.`attune.campaign_id` = '{state.campaign_id}' and tags.`attune.parent` = 'true'"):
            return run.info.run_id
        run = self.client.create_run(self.experiment_id, run_name=f"campaign-{state.campaign_id}",
                                     tags=tags | {"attune.campaign_id": state.campaign_id, "attune.parent": "true"})
        self.client.log_text(run.info.run_id, state.recipe_toml, "baseline_recipe.toml")
        return run.info.run_id

    def log_missing_trials(self, parent_id: str, state: CampaignState, recipe_of: Callable[[TrialRecord], str],
                           tags: dict[str, str]) -> list[int]:
        """Give every recorded trial without a saved MLflow run id its run: the one logged before a
        kill if it was finished, else a new one (a run cut off half-way is deleted). The indexes of
        the trials given an id (the state must be saved when there are any)."""
        missing = [t for t in state.trials if t.mlflow_run_id is None]
        if not missing:
            return []
        wanted, found = {t.index for t in missing}, {}
        for run in self._find(f"tags.`mlflow.parentRunId` = '{parent_id}'"):
            index = int(run.data.tags.get("attune.trial_index", -1))
            if index not in wanted:
                continue
            if run.info.status in ("FINISHED", "FAILED") and index not in found:
                found[index] = run.info.run_id
            else:
                self.client.delete_run(run.info.run_id)
        for record in missing:
            record.mlflow_run_id = found.get(record.index) or self.log_trial(parent_id, record, recipe_of(record), tags)
        return [t.index for t in missing]

    def log_trial(self, parent_id: str, record: TrialRecord, recipe_toml: str, tags: dict[str, str],
                  extra_artifacts: dict[str, str] | None = None) -> str:
        from mlflow.entities import Metric, Param, RunTag

        run = self.client.create_run(self.experiment_id, run_name=f"{record.role}-{record.index:03d}",
                                     tags=tags | {"mlflow.parentRunId": parent_id, "attune.role": record.role,
                                                  "attune.trial_index": str(record.index),
                                                  "attune.status": record.result.status.value})
        now = int(time.time() * 1000)
        params = [Param(k, str(v)) for k, v in sorted(record.levers.items())]
        metrics = [Metric(name, float(value), now, 0) for name, value in (
            ("tokens_per_sec_per_gpu", record.result.tokens_per_sec_per_gpu), ("mfu", record.result.mfu),
            ("step_time_s", record.result.step_time_s), ("peak_memory_gib", record.result.peak_memory_gib),
            ("gpu_hours", record.result.gpu_hours), ("wall_time_s", record.result.wall_time_s),
            ("allocation_s", record.result.breakdown.get("allocation_s"))) if value is not None]
        # what held the GPUs where a scheduler says so (a pooled trial: "slurm job 12")
        allocation = [RunTag("attune.allocation", str(record.result.breakdown["allocation"]))
                      ] if record.result.breakdown.get("allocation") else []
        for step in record.result.steps:
            for name in ("loss", "tps", "mfu", "memory_gib", "grad_norm"):
                value = getattr(step, name)
                if value is not None:
                    metrics.append(Metric(f"step_{name}", float(value), now, step.step))
        self.client.log_batch(run.info.run_id, metrics=metrics[:1000], params=params,
                              tags=[RunTag("attune.lesson", record.lesson_id or "")] + allocation)
        self.client.log_text(run.info.run_id, recipe_toml, "recipe.toml")
        self.client.log_text(run.info.run_id, json.dumps({"diagnosis": [s.model_dump() for s in record.diagnosis],
                                                          "move": record.move, "rationale": record.rationale,
                                                          "breakdown": record.result.breakdown}, indent=1, default=str),
                             "diagnosis.json")
        for name, text in (extra_artifacts or {}).items():
            self.client.log_text(run.info.run_id, redact(text), name)
        self.client.set_terminated(run.info.run_id, "FINISHED" if record.result.ok else "FAILED")
        return run.info.run_id

    def log_gate(self, parent_id: str, gate: dict[str, Any] | None, tags: dict[str, str], number: int = 0) -> str | None:
        """The correctness gate as its own nested run: its verdict, what it cost, the curves it read
        and the plot (a person looks at the curves, not the numbers). `number` counts the campaign's
        verdicts (a fall back gates a second candidate): a run of that number logged before a kill is
        kept, one cut off half-way replaced."""
        if gate is None:
            return None
        from mlflow.entities import Metric, RunTag
        for run in self._find(f"tags.`mlflow.parentRunId` = '{parent_id}' and tags.`attune.gate_number` = '{number}'"):
            if run.info.status in ("FINISHED", "FAILED"):
                return run.info.run_id
            self.client.delete_run(run.info.run_id)
        passed = bool(gate.get("passed"))
        run = self.client.create_run(self.experiment_id, run_name="gate",
                                     tags=tags | {"mlflow.parentRunId": parent_id, "attune.role": "gate",
                                                  "attune.gate_number": str(number),
                                                  "attune.gate_trainer": str(gate.get("trainer", "proxy")),
                                                  "attune.gate_passed": str(passed).lower(),
                                                  "attune.gate_verdict": str(gate.get("verdict")
                                                                             or ("passed" if passed else "failed"))})
        now = int(time.time() * 1000)
        figures = {"gpu_hours": gate.get("gpu_hours"), "seconds": gate.get("seconds"),
                   "steps_used": gate.get("steps_used")}
        self.client.log_batch(run.info.run_id, tags=[RunTag("attune.gate_note", str(gate.get("note", ""))[:500])],
                              metrics=[Metric(k, float(v), now, 0) for k, v in figures.items()
                                       if isinstance(v, (int, float))])
        self.client.log_dict(run.info.run_id, gate, "gate_report.json")
        plot = gate.get("plot") or (gate.get("convergence") or {}).get("plot")
        if plot and Path(plot).is_file():
            self.client.log_artifact(run.info.run_id, plot)
            curves = Path(plot).parent / "curves"
            if curves.is_dir():
                self.client.log_artifacts(run.info.run_id, str(curves), "curves")
        self.client.set_terminated(run.info.run_id, "FINISHED" if passed else "FAILED")
        return run.info.run_id

    def finish_campaign(self, parent_id: str, result: dict[str, Any], report_md: str, gate: dict | None,
                        shipped_toml: str | None) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(result[k]), now, 0) for k in ("gain", "gpu_hours_used", "budget_gpu_hours")
                   if isinstance(result.get(k), (int, float))]
        metrics.append(Metric("best_tokens_per_sec_per_gpu", float(result["best"]["tokens_per_sec_per_gpu"]), now, 0))
        self.client.log_batch(parent_id, metrics=metrics)
        self.client.set_tag(parent_id, "attune.stop_reason", result["stop_reason"][:500])
        self.client.set_tag(parent_id, "attune.shipped", str(result["shipped"]).lower())
        self.client.log_text(parent_id, report_md, "report.md")
        self.client.log_dict(parent_id, result, "result.json")
        if gate is not None:
            self.client.log_dict(parent_id, gate, "gate_report.json")
            plot = gate.get("plot") or (gate.get("convergence") or {}).get("plot")
            if plot and Path(plot).is_file():
                self.client.log_artifact(parent_id, plot)
        if shipped_toml:
            self.client.log_text(parent_id, shipped_toml, "shipped_recipe.toml")
            self.client.set_tag(parent_id, "attune.role", "shipped")
        self.client.set_terminated(parent_id, "FINISHED")


def redact(text: str) -> str:
    """Drop the values of any environment variable that looks like a secret from logged text."""
    for name, value in os.environ.items():
        if value and len(value) >= 6 and any(m in name.upper() for m in SECRET_MARKERS):
            text = text.replace(value, "***")
    return text
