"""Fault injection at every save point of a campaign: kill the process there, resume, check nothing
was lost or counted twice.

A campaign saves its state at fixed points (before and after each trial, after logging it, at each
phase). `run_to_kill_point` runs `attune tune` as a real process whose N-th save ends the process
with os._exit(137) (no cleanup, no flushing: a SIGKILL or a lost node), either right after the write
(`after`) or right before it (`before`: everything since the previous save, MLflow runs and files
included, happened, the state does not know it). Then the same command runs again to the end.

Runs share one real Prefect server (PREFECT_API_URL), so a kill leaves no ephemeral server behind
and each run pays no server start; each kill point gets a fresh ATTUNE_HOME with the reference run's
gate cache copied in (the cache is keyed by content: a verdict is the same whoever computed it).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Installed in the campaign's process by `-c`: counts CampaignState.save calls and dies at one.
HOOK = """
import atexit, os, sys
from attune.campaign import state as _state
_target, _mode, _count = int(os.environ.get("KILL_AT_SAVE", "0")), os.environ.get("KILL_MODE", "after"), [0]
_save = _state.CampaignState.save
def _counting_save(self, path):
    _count[0] += 1
    if _count[0] == _target and _mode == "before":
        os._exit(137)
    _save(self, path)
    if _count[0] == _target and _mode == "after":
        os._exit(137)
_state.CampaignState.save = _counting_save
if os.environ.get("KILL_COUNT_FILE"):
    atexit.register(lambda: open(os.environ["KILL_COUNT_FILE"], "w").write(str(_count[0])))
from attune.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def run_campaign(home: Path, args: list[str], env: dict[str, str], kill_at: int = 0, mode: str = "after",
                 count_file: Path | None = None, timeout: float = 600) -> Outcome:
    run_env = dict(env, ATTUNE_HOME=str(home), KILL_AT_SAVE=str(kill_at), KILL_MODE=mode,
                   PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    if count_file is not None:
        run_env["KILL_COUNT_FILE"] = str(count_file)
    proc = subprocess.run([sys.executable, "-c", HOOK, "tune", *args], cwd=home.parent, env=run_env,
                          capture_output=True, text=True, timeout=timeout)
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def campaign_state(home: Path) -> dict:
    files = sorted(home.glob("campaigns/*/state.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def trial_hours(trial: dict) -> float:
    result = trial["result"]
    return result["gpus"] * result["wall_time_s"] / 3600.0


def mlflow_runs(home: Path) -> dict[str, list]:
    """Active runs by kind: the campaign's parent, one per trial index, the gate's."""
    db = sqlite3.connect(home / "mlflow.db")
    try:
        rows = db.execute("select r.run_uuid, t.key, t.value from runs r join tags t on t.run_uuid = r.run_uuid "
                          "where r.lifecycle_stage = 'active'").fetchall()
    finally:
        db.close()
    tags: dict[str, dict[str, str]] = {}
    for run, key, value in rows:
        tags.setdefault(run, {})[key] = value
    return {"parent": [r for r, t in tags.items() if t.get("attune.parent") == "true"],
            "trials": sorted(int(t["attune.trial_index"]) for t in tags.values() if "attune.trial_index" in t),
            "gates": [r for r, t in tags.items() if t.get("attune.role") == "gate"]}


def ledger_moves(home: Path, campaign_id: str) -> int:
    """Moves the campaign put in the lessons ledger of the default store (one object per campaign)."""
    path = home / "store" / "lessons" / "ledger" / f"{campaign_id}.json"
    return len(json.loads(path.read_text())["moves"]) if path.is_file() else 0


def check_resumed(home: Path, reference: dict, reference_home: Path) -> list[str]:
    """What is wrong with the campaign in `home` (resumed after a kill) against the uninterrupted
    `reference` result; empty when nothing is."""
    problems = []
    state = campaign_state(home)
    result = state["result"] or {}
    spent, total = state["budget"]["spent_gpu_hours"], state["budget"]["total_gpu_hours"]
    charged = sum(trial_hours(t) for t in state["trials"]) + state["lost_gpu_hours"] + state["gate_gpu_hours"]
    if spent > total + 1e-9:
        problems.append(f"budget exceeded: {spent} > {total}")
    if abs(spent - charged) > 1e-9:
        problems.append(f"charges do not add up: spent {spent}, trials + lost + gate {charged}")
    if [t["index"] for t in state["trials"]] != list(range(len(state["trials"]))):
        problems.append("trial indexes not 0..n-1")
    if state["phase"] != "done":
        problems.append(f"phase {state['phase']}, not done")
    ref_state = campaign_state(reference_home)
    if [t["levers"] for t in state["trials"]] != [t["levers"] for t in ref_state["trials"]]:
        problems.append(f"trials differ from the uninterrupted campaign ({len(state['trials'])} vs "
                        f"{len(ref_state['trials'])})")
    for key in ("shipped", "gain", "trials"):
        if result.get(key) != reference.get(key):
            problems.append(f"{key}: {result.get(key)!r}, uninterrupted {reference.get(key)!r}")
    if (result.get("best") or {}).get("levers") != reference["best"]["levers"]:
        problems.append("a different best layout")
    if abs(result.get("gpu_hours_used", -1) - (reference["gpu_hours_used"] + state["lost_gpu_hours"])) > 1e-9:
        problems.append(f"GPU-hours {result.get('gpu_hours_used')} != uninterrupted {reference['gpu_hours_used']} "
                        f"+ lost {state['lost_gpu_hours']}")
    runs = mlflow_runs(home)
    if len(runs["parent"]) != 1:
        problems.append(f"{len(runs['parent'])} MLflow campaign runs")
    if runs["trials"] != list(range(len(state["trials"]))):
        problems.append(f"MLflow trial runs {runs['trials']} for {len(state['trials'])} trials")
    if len(runs["gates"]) != len(mlflow_runs(reference_home)["gates"]):
        problems.append(f"{len(runs['gates'])} MLflow gate runs")
    missing_ids = [t["index"] for t in state["trials"] if not t["mlflow_run_id"]]
    if missing_ids:
        problems.append(f"trials without a saved MLflow run id: {missing_ids}")
    if ledger_moves(home, state["campaign_id"]) != ledger_moves(reference_home, state["campaign_id"]):
        problems.append("the lessons ledger holds a different number of the campaign's moves")
    return problems


def fresh_home(root: Path, name: str, reference_home: Path) -> Path:
    home = root / name / ".attune"
    home.mkdir(parents=True)
    if (reference_home / "gate-cache").is_dir():
        shutil.copytree(reference_home / "gate-cache", home / "gate-cache")
    return home


def client_env(api_url: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ATTUNE_", "MLFLOW_"))}
    return keep | {"PREFECT_API_URL": api_url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                   "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"}
