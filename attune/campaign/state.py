"""The persisted campaign: every trial, the budget spent, the incumbent and why it stopped.

Saved atomically after every change, so a retried task or a re-run of the same command resumes
where it stopped and never charges a finished trial twice. A trial that was running when the
process died is charged at its estimate on resume (its GPUs were held) and run again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from attune.campaign.budget import Budget
from attune.campaign.diagnosis import Symptom
from attune.files import atomic_write_text
from attune.stacks.base import TrialResult

Role = Literal["baseline", "trial", "confirm"]
Phase = Literal["baseline", "search", "confirm", "gate", "done"]


class TrialRecord(BaseModel):
    index: int
    role: Role
    levers: dict[str, Any]
    config: dict[str, Any]
    result: TrialResult
    diagnosis: list[Symptom] = []
    move: dict[str, Any] | None = None
    parent: int | None = None
    lesson_id: str | None = None
    rationale: str = ""
    attempts: int = 1
    mlflow_run_id: str | None = None

    @property
    def tps(self) -> float:
        return (self.result.tokens_per_sec_per_gpu or 0.0) if self.result.ok else 0.0


class PendingTrial(BaseModel):
    role: Role
    levers: dict[str, Any]
    estimated_gpu_hours: float


class CampaignState(BaseModel):
    campaign_id: str
    recipe_toml: str
    settings: dict[str, Any]                # what it was asked (attune.campaign.context.CampaignSettings)
    budget: Budget
    trials: list[TrialRecord] = []
    phase: Phase = "baseline"
    incumbent: int | None = None
    rejected: list[dict[str, Any]] = []     # numerics-tier incumbents the gate refused: levers, report
    gate_probes: list[dict[str, Any]] = []  # layouts the planner had gated before measuring: levers, passed
    gate_gpu_hours: float = 0.0             # what real-trainer gate runs were charged (torchtitan stack)
    noise_rel_sd: float | None = None
    noise_band: float | None = None
    pending: PendingTrial | None = None
    lost_gpu_hours: float = 0.0
    stop_reason: str | None = None
    gate: dict[str, Any] | None = None
    shipped: bool = False
    recipe_out: str | None = None
    mlflow_run_id: str | None = None
    llm_usage: dict[str, int] = {}
    result: dict[str, Any] | None = None

    # --- derived views -------------------------------------------------------------------------
    def of_role(self, role: Role) -> list[TrialRecord]:
        return [t for t in self.trials if t.role == role]

    @property
    def baseline_tps(self) -> list[float]:
        return [t.tps for t in self.of_role("baseline") if t.result.ok]

    @property
    def incumbent_record(self) -> TrialRecord | None:
        return self.trials[self.incumbent] if self.incumbent is not None else None

    def measured(self, levers: dict[str, Any]) -> list[TrialRecord]:
        return [t for t in self.trials if t.levers == levers]

    # --- persistence ---------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        atomic_write_text(path, self.model_dump_json(indent=1))

    @classmethod
    def load(cls, path: Path) -> "CampaignState":
        return cls.model_validate_json(path.read_text())


def campaign_id(recipe_toml: str, **settings: Any) -> str:
    """Same recipe and settings, same campaign: a re-run of the same command resumes it."""
    text = recipe_toml + json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
