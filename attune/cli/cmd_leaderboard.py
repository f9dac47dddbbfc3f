"""`attune leaderboard [publish]`: TrainingThroughputBench, the fastest verified recipes.

The board is the committed seed (leaderboard/ in the repository) merged with the configured store
(--store, else $ATTUNE_STORE, else the folder under $ATTUNE_HOME / ./.attune).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attune.errors import InputError
from attune.leaderboard import PUBLISHED, SEED_DIR, load_board, publish, render
from attune.store import open_store


def register(subparsers: argparse._SubParsersAction) -> None:
    board = subparsers.add_parser(
        "leaderboard", help="TrainingThroughputBench: best verified recipe per model and cluster",
        description="Show the board (default) or publish it into the store as "
                    + ", ".join(PUBLISHED.values()) + ".")
    board.add_argument("action", nargs="?", choices=["show", "publish"], default="show", metavar="ACTION",
                       help="show (default) or publish")
    board.add_argument("--store", metavar="URI",
                       help="s3://BUCKET/PREFIX or a folder (default: $ATTUNE_STORE, else $ATTUNE_HOME/store)")
    board.add_argument("--model", metavar="MODEL", help="only this model, e.g. llama3.1-8b")
    board.add_argument("--format", choices=["md", "html", "json"], default="md", metavar="FORMAT",
                       help="md | html | json (show; default md)")
    board.add_argument("--output", metavar="FILE", help="write to FILE instead of stdout (show)")
    seed = board.add_mutually_exclusive_group()
    seed.add_argument("--seed", metavar="DIR", help=f"seed board folder (default: {SEED_DIR})")
    seed.add_argument("--no-seed", action="store_true", help="leave the committed seed board out")
    board.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.seed and not Path(args.seed).is_dir():
        raise InputError("--seed", f"{args.seed}: folder not found")
    seed_dir = None if args.no_seed else (args.seed or SEED_DIR)
    board = load_board(args.store, model=args.model, seed_dir=seed_dir)
    if args.action == "publish":
        for where in publish(board, open_store(args.store)):
            print(f"published {where}")
        print(f"{len(board.rows)} rows ({sum(r.simulated for r in board.rows)} simulated)")
        return 0
    text = render(board, args.format)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text)
        print(f"wrote {args.output} ({len(board.rows)} rows)")
    else:
        sys.stdout.write(text)
    return 0
