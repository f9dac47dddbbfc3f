"""Seed the committed TrainingThroughputBench board (leaderboard/) by running one campaign per
(recipe, cluster) pair of leaderboard/seed-plan.toml and writing each result through the store API.

    .venv/bin/python scripts/seed_leaderboard.py                 # every run in the plan
    .venv/bin/python scripts/seed_leaderboard.py --only llama3_8b --budget 32
    .venv/bin/python scripts/seed_leaderboard.py --dry-run       # print the plan, run nothing

Contract with the campaign: `flows.campaign.run_campaign_for_seed(recipe_path, cluster, budget)`
(recipe_path: str, cluster: "h100:8", budget: GPU-hours) returns a StoreEntry (or its dict) for
the recipe the campaign ended with, or None when it has nothing to record. Unverified entries are
stored too (the store ranks them below any verified one) but never reach the board.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from attune.store import RecipeStore, StoreEntry, open_store  # noqa: E402

PLAN = REPO / "leaderboard" / "seed-plan.toml"
SEED = REPO / "leaderboard"
Runner = Callable[[str, str, float], Any]


def load_plan(path: Path, only: str | None = None, budget: float | None = None) -> list[tuple[str, str, float]]:
    """(recipe path, cluster, budget GPU-hours) per run; recipe paths are relative to the repo."""
    plan = tomllib.loads(path.read_text())
    runs = []
    for run in plan.get("run", []):
        recipe = str((REPO / run["recipe"]).resolve()) if not Path(run["recipe"]).is_absolute() else run["recipe"]
        if only and only not in run["recipe"] and only not in run["cluster"]:
            continue
        runs.append((recipe, run["cluster"], float(budget or run.get("budget_gpu_hours", plan["budget_gpu_hours"]))))
    return runs


def seed(runs: list[tuple[str, str, float]], store: RecipeStore, runner: Runner) -> list[dict]:
    """Run each campaign and put its entry; one failing run does not stop the others."""
    report = []
    for recipe, cluster, budget in runs:
        row: dict[str, Any] = {"recipe": recipe, "cluster": cluster, "budget_gpu_hours": budget}
        try:
            result = runner(recipe, cluster, budget)
            if result is None:
                row["outcome"] = "nothing to record"
            else:
                entry = result if isinstance(result, StoreEntry) else StoreEntry.model_validate(result)
                kept, current = store.put(entry)
                row |= {"outcome": "stored" if kept else "kept the stored entry", "key": current.key,
                        "gate_passed": entry.gate_passed, "tokens_per_sec_per_gpu": entry.tokens_per_sec_per_gpu}
        except Exception as err:  # noqa: BLE001 - report it and go on with the next campaign
            row["outcome"] = f"failed: {type(err).__name__}: {err}"
        print(_line(row), flush=True)
        report.append(row)
    return report


def _line(row: dict) -> str:
    name = Path(row["recipe"]).name
    extra = "" if "key" not in row else (f" ({row['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU, "
                                         f"gate {'passed' if row['gate_passed'] else 'failed'})")
    return f"{name} on {row['cluster']}: {row['outcome']}{extra}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", type=Path, default=PLAN, help="seed plan TOML (default: %(default)s)")
    parser.add_argument("--store", default=str(SEED), help="where entries go (default: the committed board)")
    parser.add_argument("--only", metavar="TEXT", help="only runs whose recipe path or cluster contains TEXT")
    parser.add_argument("--budget", type=float, help="GPU-hour budget for every run (overrides the plan)")
    parser.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    args = parser.parse_args(argv)

    runs = load_plan(args.plan, args.only, args.budget)
    missing = [recipe for recipe, _, _ in runs if not Path(recipe).is_file()]
    if missing:
        print(f"seed_leaderboard: recipe files not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.dry_run:
        for recipe, cluster, budget in runs:
            print(f"{Path(recipe).relative_to(REPO) if recipe.startswith(str(REPO)) else recipe} "
                  f"on {cluster}, budget {budget:g} GPU-h")
        return 0
    try:
        from attune.flows.campaign import run_campaign_for_seed
    except ImportError as err:
        print(f"seed_leaderboard: flows.campaign.run_campaign_for_seed is not available yet ({err})",
              file=sys.stderr)
        return 2
    report = seed(runs, open_store(args.store), run_campaign_for_seed)
    failed = [row for row in report if row["outcome"].startswith("failed")]
    print(f"{len(report) - len(failed)} of {len(report)} campaigns recorded in {args.store}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
