"""The persisted campaign: every trial, the budget spent, the incumbent and why it stopped.

Saved atomically after every change, so a retried task or a re-run of the same command resumes
where it stopped and never charges a finished trial twice: a trial's charge and its record are one
write. A trial that was running when the process died is charged at its estimate on resume (its
GPUs were held) and run again; what was charged without a record to show for it (that, a stopped
trial, a retried attempt) is `lost_gpu_hours`, so the budget always adds up:

    spent = sum of the trials' GPU-hours + lost_gpu_hours + gate_gpu_hours

The file carries its format's version; a file this code cannot read (damaged, cut short, written by
another version) is refused with one line naming it and what to do, never resumed from a guess.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from attune.campaign.budget import Budget
from attune.campaign.diagnosis import Symptom
from attune.campaign.protocol import Protocol
from attune.campaign.carried import WarmStart
from attune.errors import InputError
from attune.files import atomic_write_text, attune_home
from attune.levers import layout_key
from attune.stacks.base import TrialResult
from attune.validation import first_error

# 2: the settings in one model (version 1, unmarked, copied them field by field); since marked, also
# the gate's MLflow run and whether the lessons ledger has this campaign's moves
STATE_VERSION = 2

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
    steps: int | None = None          # measured steps the run was asked for (None: saved before it was kept)

    @property
    def tps(self) -> float:
        return (self.result.tokens_per_sec_per_gpu or 0.0) if self.result.ok else 0.0


class PendingTrial(BaseModel):
    role: Role
    levers: dict[str, Any]
    estimated_gpu_hours: float


class CampaignState(BaseModel):
    version: int = STATE_VERSION
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
    protocol: Protocol | None = None        # how it measures (attune.campaign.protocol); None: the fixed one
    skipped: list[str] = []                 # runs the fixed protocol measures that this one skipped, and why
    confirm_plan: dict[str, Any] | None = None   # the incumbent's planned confirmation runs: levers, runs
    warm: WarmStart | None = None           # what an earlier campaign carried over (attune.campaign.warm_start)
    noise_rel_sd: float | None = None
    noise_band: float | None = None
    pending: PendingTrial | None = None
    lost_gpu_hours: float = 0.0             # charged with no trial record: died or stopped mid-trial, retried
    stop_reason: str | None = None
    gate: dict[str, Any] | None = None
    shipped: bool = False
    recipe_out: str | None = None
    mlflow_run_id: str | None = None
    gate_mlflow_run_id: str | None = None   # the gate's nested run, for the verdict in `gate`
    lessons_recorded: bool = False          # this campaign's moves are in the lessons ledger
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

    def runs_by_layout(self) -> dict[tuple, list[float]]:
        """The throughputs of every successful run that reported one, per layout (attune.levers.layout_key)."""
        runs: dict[tuple, list[float]] = {}
        for t in self.trials:
            if t.result.ok and t.tps:
                runs.setdefault(layout_key(t.levers), []).append(t.tps)
        return runs

    # --- persistence ---------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        atomic_write_text(path, self.model_dump_json(indent=1))

    @classmethod
    def load(cls, path: Path) -> "CampaignState":
        """The state saved at `path`, or an InputError naming the file, what is wrong and what to do."""
        try:
            raw = json.loads(path.read_bytes())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DamagedState(path, f"not valid JSON ({type(err).__name__} at byte {getattr(err, 'pos', 0)})") from None
        if not isinstance(raw, dict):
            raise DamagedState(path, f"a JSON {type(raw).__name__}, not a campaign state")
        # unmarked: a campaign's state without `settings` is version 1; anything else is read as this
        # format before it was marked (and refused field by field if it is not)
        version = raw.get("version", 1 if "campaign_id" in raw and "settings" not in raw else STATE_VERSION)
        if version != STATE_VERSION:
            raise DamagedState(path, f"written by another version of attune (state format {version!r}, "
                                     f"this one reads {STATE_VERSION})")
        try:
            return cls.model_validate(raw)
        except ValidationError as err:
            field, rule = first_error(err)
            raise DamagedState(path, f"{field}: {rule}") from None


class DamagedState(InputError):
    """A state file that cannot be resumed from: the user decides, attune does not guess."""

    def __init__(self, path: Path, why: str):
        self.why = why
        super().__init__(str(path), f"cannot resume this campaign: {why}; delete {path.parent} to start it "
                                    f"afresh (`attune campaigns discard {path.parent.name}`; its trials will be run "
                                    f"and charged again), or restore the file")


def campaign_id(recipe_toml: str, **settings: Any) -> str:
    """Same recipe and settings, same campaign: a re-run of the same command resumes it."""
    text = recipe_toml + json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def campaigns_dir(home: Path | None = None) -> Path:
    """Where every campaign keeps its folder: $ATTUNE_HOME/campaigns."""
    return (home or attune_home()) / "campaigns"


def campaign_folder(recipe_name: str, cid: str, home: Path | None = None) -> Path:
    return campaigns_dir(home) / f"{recipe_name}-{cid}"
