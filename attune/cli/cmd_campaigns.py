"""`attune campaigns [list | show ID | resume ID | discard ID]`: the campaigns under $ATTUNE_HOME.

ID is a campaign's folder name (<recipe>-<id>), its 12-character id, or a unique prefix of either.
"""

from __future__ import annotations

import argparse
import sys

from attune.campaign.budget import hours_text
from attune.campaign.listing import (CampaignSummary, discard_campaign, find_campaign, list_campaigns, summarize,
                                     trial_rows)
from attune.campaign.state import CampaignState
from attune.cli.common import emit
from attune.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "campaigns", help="list the campaigns under $ATTUNE_HOME; show, resume or discard one",
        description="The campaigns under $ATTUNE_HOME (default ./.attune): status (done, stopped, running, "
                    "damaged), recipe, cluster, stack, planner, GPU-hours spent of the budget, best gain so far, "
                    "why it stopped, the shipped recipe and the MLflow run. ID is a campaign's folder name, its id, "
                    "or a unique prefix of either.")
    p.add_argument("action", nargs="?", choices=("list", "show", "resume", "discard"), default="list", metavar="ACTION",
                   help="list (default) | show ID | resume ID | discard ID")
    p.add_argument("id", nargs="?", metavar="ID", help="the campaign (show, resume, discard)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--quiet", action="store_true", help="resume: no progress lines on stderr")
    p.add_argument("--mlflow-uri", metavar="URI", help="resume: the MLflow it tracked to (default: $MLFLOW_TRACKING_URI, else SQLite under "
                                                       "$ATTUNE_HOME)")
    p.add_argument("--store", metavar="URI", help="resume: the recipe store (default: $ATTUNE_STORE, else "
                                                  "$ATTUNE_HOME/store)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.action == "list":
        if args.id:
            raise InputError("ID", "`attune campaigns list` takes no ID (show, resume and discard do)")
        rows = list_campaigns()
        emit([r.model_dump() for r in rows], args.json, _table(rows))
        return 0
    if not args.id:
        raise InputError("ID", f"`attune campaigns {args.action}` needs the campaign's ID (`attune campaigns` lists them)")
    folder = find_campaign(args.id)
    if args.action == "discard":
        discard_campaign(folder)
        emit({"discarded": str(folder)}, args.json, f"discarded {folder}")
        return 0
    summary = summarize(folder)
    if summary.status == "damaged":
        raise InputError(str(folder / "state.json"), f"cannot be resumed: {summary.problem}; "
                                                     f"`attune campaigns discard {folder.name}` removes it")
    if args.action == "show":
        state = CampaignState.load(folder / "state.json")
        emit(summary.model_dump() | {"trials": trial_rows(state)}, args.json, _details(summary, state))
        return 0
    return _resume(args, folder, summary)


def _resume(args: argparse.Namespace, folder, summary: CampaignSummary) -> int:
    """Run the campaign on from its saved state: its own recipe and settings (the state has both),
    so it is the same campaign as the command that started it."""
    if summary.status == "running":
        raise InputError("ID", f"{folder.name} is running in another process")
    from attune.campaign.context import CampaignSettings
    from attune.cli import cmd_tune
    from attune.files import atomic_write_text

    state = CampaignState.load(folder / "state.json")
    settings = CampaignSettings.of(**state.settings)
    recipe_path = atomic_write_text(folder / "recipe.toml", state.recipe_toml)
    if not args.quiet:
        print(f"attune: resuming {folder.name} ({summary.phase}, {summary.trials} trials)", file=sys.stderr)
    return cmd_tune.run_campaign(str(recipe_path), settings, mlflow_uri=args.mlflow_uri, store=args.store,
                                 quiet=args.quiet, as_json=args.json)


def _gain(value: float | None) -> str:
    return f"{value:+.1%}" if value is not None else "-"


def _spent(s: CampaignSummary) -> str:
    if s.spent_gpu_hours is None:
        return "-"
    return f"{hours_text(s.spent_gpu_hours)}/{hours_text(s.budget_gpu_hours or 0)}"


def _table(rows: list[CampaignSummary]) -> str:
    if not rows:
        return "no campaigns under $ATTUNE_HOME yet (`attune tune RECIPE --budget-gpu-hours H` starts one)"
    header = ["ID", "STATUS", "CLUSTER", "STACK", "PLANNER", "GPU-H", "GAIN", "TRIALS", "UPDATED", "WHY / SHIPPED"]
    lines = [header]
    for s in rows:
        why = s.problem if s.status == "damaged" else (s.shipped or s.stop_reason or s.phase or "")
        lines.append([s.id, s.status, s.cluster or "-", s.stack or "-", s.planner or "-", _spent(s), _gain(s.best_gain),
                      str(s.trials), s.updated.replace("+00:00", "Z"), (why or "")[:70]])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in lines)


def _details(s: CampaignSummary, state: CampaignState) -> str:
    head = [f"{s.id}: {s.status} ({s.phase}), {s.recipe} on {s.cluster}, stack {s.stack}, planner {s.planner}",
            f"  GPU-hours {_spent(s)} (lost {hours_text(state.lost_gpu_hours)}, gate {hours_text(state.gate_gpu_hours)}),"
            f" best gain {_gain(s.best_gain)}",
            f"  {s.stop_reason or 'not finished'}",
            f"  shipped: {s.shipped or 'no'}   MLflow run: {s.mlflow_run_id or '-'}   folder: {s.directory}"]
    rows = [f"  #{r['index']:<3} {r['role']:<8} {r['status']:<10} {r['tokens_per_sec_per_gpu']:>10,.0f} tok/s/GPU "
            f"{hours_text(r['gpu_hours']):>6} GPU-h  {r['lesson'] or ''}" for r in trial_rows(state)]
    if s.status == "stopped":
        rows.append(f"  resume: attune campaigns resume {s.id}")
    return "\n".join(head + rows)
