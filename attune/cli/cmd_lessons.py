"""`attune lessons`: the lessons catalog with what earlier campaigns measured for each lesson.

Without a recipe every campaign of the ledger counts alike; with one (and its --cluster, --stack),
each lesson's figure is the prior a campaign of that recipe would start from (attune.lessons.posterior).
"""

from __future__ import annotations

import argparse

from attune.campaign.lessons_ledger import context_of
from attune.cli.common import emit, recipe_from_args
from attune.lessons import ledger
from attune.lessons.catalog import load_lessons
from attune.lessons.posterior import posterior
from attune.store import open_store


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("lessons", help="the lessons catalog and what campaigns measured for each lesson")
    p.add_argument("recipe", metavar="RECIPE", nargs="?", help="a recipe: each lesson's prior for a campaign of it "
                                                              "(default: over every campaign alike)")
    p.add_argument("--cluster", metavar="ACCEL:COUNT", help="with RECIPE: on another cluster, e.g. h200:128")
    p.add_argument("--model-spec", metavar="FILE", help="with RECIPE: a model spec file replacing the recipe's model")
    p.add_argument("--stack", default="sim", choices=("sim", "torchtitan", "measured"),
                   help="with RECIPE: the stack the campaign would run on (default: sim)")
    p.add_argument("--store", metavar="URI", help="the recipe store whose ledger to read: a folder or "
                                                 "s3://BUCKET/PREFIX (default: $ATTUNE_STORE, else $ATTUNE_HOME/store)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_lessons)


def _lessons(args: argparse.Namespace) -> int:
    store = open_store(args.store)
    entries, unreadable = ledger.read(store.blobs)
    context = None
    if args.recipe:
        context = context_of(recipe_from_args(args), args.stack)
    rows = []
    for lesson in load_lessons():
        belief = posterior(lesson, entries, context)
        rows.append({"id": lesson.id, "title": lesson.title, "when": lesson.when.model_dump(),
                     "try": lesson.try_.model_dump(), "catalog_gain": lesson.expected_gain,
                     "gain": round(belief.gain, 4), "sd": round(belief.sd, 4), "campaigns": belief.campaigns,
                     "did_not_run": belief.failed, "evidence": belief.text()})
    payload = {"store": store.location, "campaigns_in_ledger": len(entries), "unreadable": unreadable,
               "context": context.model_dump() if context else None, "lessons": rows}
    lines = [f"{len(entries)} campaign(s) in the ledger of {store.location}"
             + (f"; priors for {context.describe()} ({context.stack})" if context else "; every campaign alike")]
    lines += [f"unreadable ledger object (skipped): {key}" for key in unreadable]
    for r in rows:
        move = f"{r['try']['lever']} {r['try']['direction']}" + (f" {r['try']['value']}" if r["try"]["value"]
                                                                    is not None else "")
        lines.append(f"{r['id']:28} {move:48} catalog {r['catalog_gain']:+6.1%}  {r['evidence'].split(': ', 1)[1]}")
    emit(payload, args.json, "\n".join(lines))
    return 0
