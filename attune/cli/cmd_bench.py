"""`attune bench`: compare planners by what they find per GPU-hour (a Prefect flow, flows/bench.py).

Every (recipe, planner, seed) campaign runs on the sim stack under the same budget (default 40
GPU-hours per 64 GPUs of the recipe's cluster); gains are scored on the simulated ground truth.
"""

from __future__ import annotations

import argparse
import os

from attune.cli.common import add_settings_arguments, emit, quiet_local_prefect

MAX_SEEDS = 1_000


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmark planners on the sim stack (simulated results)")
    p.add_argument("--recipes", nargs="+", required=True, metavar="RECIPE", help="recipe TOML files; tuned:FILE moves the recipe to the best "
                   "layout the gate passes on each seed's cluster (a well-tuned recipe: nothing left to find)")
    p.add_argument("--planners", default="attune,random,bayes,estimator-topk", metavar="PLANNERS",
                   help="comma-separated: attune, random, bayes, bayes-warm, estimator-topk, estimator-topk-naive, "
                        "grid, and attune-no-RULE (default attune,random,bayes,estimator-topk)")
    p.add_argument("--budget-gpu-hours", type=float, metavar="GPU_HOURS",
                   help="per campaign (default: 40 GPU-hours per 64 GPUs of each recipe's cluster)")
    p.add_argument("--budget-share", type=float, default=1.0, metavar="F",
                   help="without --budget-gpu-hours: F times the default budget of each recipe's cluster, e.g. "
                        "0.25 (the budget curve; default 1)")
    p.add_argument("--seeds", type=int, default=5, metavar="N", help="seeds per recipe and planner (default 5); seed s runs on "
                   "simulated cluster s + 1")
    p.add_argument("--world", default="realistic", metavar="WORLD", help="how far the simulated clusters depart from the public "
                   "estimator: easy | realistic | hard (default realistic)")
    p.add_argument("--cluster", metavar="ACCEL:COUNT", help="run every recipe on this cluster, e.g. h100:64")
    p.add_argument("--model-spec", metavar="FILE", help="model spec file replacing every recipe's model")
    p.add_argument("--disable-rule", action="append", default=[], metavar="RULE",
                   help="switch a search rule of the attune planner off (repeatable): "
                        + ", ".join(_rules()))
    p.add_argument("--ablations", action="store_true", help="add attune-no-RULE for every rule (ablation table)")
    add_settings_arguments(p, only=("steps_per_trial", "replicates", "gate_steps"))   # each campaign's, as tune's
    p.add_argument("--gate-seed", type=int, default=0, metavar="N",
                   help="the gate's proxy seed for every campaign (default 0: a candidate gets one verdict "
                        "whichever planner or seed found it); -1: each campaign's own seed")
    p.add_argument("--workers", type=int, metavar="N", help="worker processes (default: one per available core)")
    p.add_argument("--out", metavar="DIR", help="where results.json/.md and the plots go "
                                                "(default $ATTUNE_HOME/bench/<time>)")
    p.add_argument("--gate-cache", metavar="DIR",
                   help="gate verdicts and proxy runs shared by the campaigns (and by later benchmarks that "
                        "name the same folder); default: a fresh one under --out")
    p.add_argument("--mlflow-uri", metavar="URI", help="MLflow tracking URI for the summary (default: "
                                                    "$MLFLOW_TRACKING_URI, else sqlite:///$ATTUNE_HOME/mlflow.db)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def _rules() -> tuple[str, ...]:
    from attune.planners.attune_planner import RULES
    return RULES


def run(args: argparse.Namespace) -> int:
    quiet_local_prefect("WARNING")
    os.environ.setdefault("MPLBACKEND", "Agg")
    _validate(args)
    from attune.flows.bench import tuner_benchmark

    payload = tuner_benchmark(args.recipes, planners=args.planners, budget_gpu_hours=args.budget_gpu_hours,
                              budget_share=args.budget_share,
                              seeds=args.seeds, world=args.world, cluster=args.cluster, model_spec=args.model_spec,
                              steps_per_trial=args.steps_per_trial, replicates=args.replicates, gate_steps=args.gate_steps,
                              gate_seed=None if args.gate_seed < 0 else args.gate_seed,
                              disabled_rules=args.disable_rule, ablations=args.ablations, workers=args.workers,
                              out=args.out, gate_cache=args.gate_cache, mlflow_uri=args.mlflow_uri,
                              quiet=args.quiet)
    emit(payload, args.json, _text(payload))
    return 0


def _validate(args: argparse.Namespace) -> None:
    """Every refusal happens here, before a flow run or a worker exists."""
    from attune.bench.request import bench_cells, bench_recipes, parse_planners
    from attune.campaign.context import CampaignSettings
    from attune.cli.common import check_tracking_uri
    from attune.errors import InputError

    # each campaign's budget and gate seed, refused as `attune tune` refuses them (> 0 and finite; < 2^32)
    if args.budget_gpu_hours is not None:
        CampaignSettings.of(budget_gpu_hours=args.budget_gpu_hours)
    try:
        CampaignSettings.of(budget_gpu_hours=1.0, gate_seed=None if args.gate_seed < 0 else args.gate_seed)
    except InputError as err:   # the setting has no flag of its own in `attune tune`
        raise InputError("--gate-seed", err.rule) from None
    if args.seeds > MAX_SEEDS:   # one campaign per seed, recipe and planner: a typo here is days of work
        raise InputError("--seeds", f"must be at most {MAX_SEEDS}, got {args.seeds}")
    if args.mlflow_uri:
        check_tracking_uri(args.mlflow_uri)
    variants = parse_planners(args.planners, args.disable_rule, args.ablations)
    recipes = bench_recipes(args.recipes, args.cluster, args.model_spec, args.budget_gpu_hours, args.budget_share)
    bench_cells(recipes, variants, args.seeds, args.steps_per_trial, args.replicates, args.gate_steps, world=args.world)
    if args.workers is not None and args.workers < 1:
        raise InputError("--workers", f"must be >= 1, got {args.workers}")


def _text(payload: dict) -> str:
    md = open(os.path.join(payload["out"], "results.md")).read()
    return md + f"\n[simulated] results, plots and campaigns in {payload['out']}\n"
