"""The campaigns under $ATTUNE_HOME at a glance: which ran, which stopped and why, what each spent
and shipped, and how to resume or discard one (`attune campaigns`).

Read from the saved states only; a state that cannot be read is listed as damaged, never guessed
at, and a campaign another process is running (its lock held) is listed as running and cannot be
discarded.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from attune.campaign.state import CampaignState, DamagedState, TrialRecord, campaigns_dir
from attune.errors import InputError
from attune.files import try_lock

Status = Literal["done", "stopped", "running", "damaged"]


class CampaignSummary(BaseModel):
    id: str                          # the folder's name: <recipe>-<campaign id>
    status: Status
    directory: str
    updated: str                     # when its state was last saved (UTC)
    recipe: str | None = None
    model: str | None = None
    cluster: str | None = None
    stack: str | None = None
    planner: str | None = None
    phase: str | None = None
    trials: int = 0
    spent_gpu_hours: float | None = None
    budget_gpu_hours: float | None = None
    best_gain: float | None = None   # the incumbent's measured gain over the baseline so far
    stop_reason: str | None = None
    shipped: str | None = None       # the shipped recipe's path
    mlflow_run_id: str | None = None
    problem: str | None = None       # why a damaged state cannot be read


def list_campaigns(home: Path | None = None) -> list[CampaignSummary]:
    """Every campaign folder, the most recently saved first."""
    root = campaigns_dir(home)
    folders = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    summaries = [summarize(folder) for folder in folders if (folder / "state.json").is_file()]
    return sorted(summaries, key=lambda s: s.updated, reverse=True)


def find_campaign(ident: str, home: Path | None = None) -> Path:
    """The folder of the campaign named by its folder name, its campaign id, or a unique prefix of
    either; an InputError naming what did not match."""
    root = campaigns_dir(home)
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    exact = [p for p in folders if ident in (p.name, p.name.rsplit("-", 1)[-1])]
    matches = exact or [p for p in folders if p.name.startswith(ident) or p.name.rsplit("-", 1)[-1].startswith(ident)]
    if not ident or "/" in ident or not matches:
        raise InputError("ID", f"no campaign {ident!r} under {root} (`attune campaigns` lists them)")
    if len(matches) > 1:
        raise InputError("ID", f"{ident!r} names {len(matches)} campaigns: "
                               f"{', '.join(p.name for p in matches[:5])}; give more of it")
    return matches[0]


def summarize(folder: Path) -> CampaignSummary:
    path = folder / "state.json"
    updated = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).isoformat(timespec="seconds")
    base = {"id": folder.name, "directory": str(folder), "updated": updated}
    try:
        state = CampaignState.load(path)
    except DamagedState as err:
        return CampaignSummary(status="damaged", problem=err.why, **base)
    recipe = _recipe_fields(state.recipe_toml)
    result = state.result or {}
    return CampaignSummary(
        status=_status(folder, state), recipe=recipe.get("name"), model=recipe.get("model"),
        cluster=recipe.get("cluster"), stack=state.settings.get("stack"), planner=state.settings.get("planner"),
        phase=state.phase, trials=len(state.trials), spent_gpu_hours=state.budget.spent_gpu_hours,
        budget_gpu_hours=state.budget.total_gpu_hours, best_gain=_best_gain(state),
        stop_reason=result.get("stop_reason") or state.stop_reason,
        shipped=state.recipe_out if state.shipped else None, mlflow_run_id=state.mlflow_run_id, **base)


def _status(folder: Path, state: CampaignState) -> Status:
    if state.phase == "done":
        return "done"
    handle = try_lock(folder / ".lock")
    if handle is None:
        return "running"
    handle.close()
    return "stopped"


def _recipe_fields(toml: str) -> dict[str, Any]:
    try:
        raw = tomllib.loads(toml)
    except tomllib.TOMLDecodeError:
        return {}
    cluster = raw.get("cluster") or {}
    model = raw.get("model") or Path(str(raw.get("model_spec", ""))).stem or None
    label = f"{cluster.get('accelerator')}:{cluster.get('gpus')}" if cluster else None
    return {"name": raw.get("name"), "model": model, "cluster": label}


def _best_gain(state: CampaignState) -> float | None:
    if state.result is not None:
        return state.result.get("gain")
    base = state.baseline_tps
    incumbent = state.incumbent_record
    if not base or incumbent is None:
        return None
    runs = [t.tps for t in state.measured(incumbent.levers) if t.result.ok]
    return (sum(runs) / len(runs)) / (sum(base) / len(base)) - 1 if runs else None


def trial_rows(state: CampaignState) -> list[dict[str, Any]]:
    """One row per trial: what `attune campaigns show` prints."""
    return [_trial_row(t) for t in state.trials]


def _trial_row(t: TrialRecord) -> dict[str, Any]:
    return {"index": t.index, "role": t.role, "status": t.result.status.value, "tokens_per_sec_per_gpu": t.tps,
            "gpu_hours": t.result.gpu_hours, "lesson": t.lesson_id, "move": t.move}


def discard_campaign(folder: Path) -> None:
    """Delete a campaign's folder; refused while another process runs it."""
    handle = try_lock(folder / ".lock")
    if handle is None:
        raise InputError("ID", f"{folder.name} is running in another process; stop it first")
    try:
        shutil.rmtree(folder)
    finally:
        handle.close()
