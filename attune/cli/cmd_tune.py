"""`attune tune`: run one campaign as a Prefect flow (see flows/campaign.py)."""

from __future__ import annotations

import argparse
import sys

from attune.cli.common import (add_settings_arguments, add_sim_cluster_arguments, check_sim_cluster_arguments, emit,
                               quiet_local_prefect, settings_from_args)
from attune.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tune", help="tune a recipe within a GPU-hour budget (a Prefect flow); the same command resumes it",
        description="Tune RECIPE within --budget-gpu-hours: baseline replicates and their noise band, a search\n"
                    "that moves one lever at a time, a confirmation, the correctness gate, and only then ship.\n\n"
                    "Running the same command again resumes a stopped campaign (Ctrl-C, SIGTERM, a cancel in\n"
                    "Prefect): same recipe and settings, same folder under $ATTUNE_HOME/campaigns/, no trial\n"
                    "charged twice. `attune campaigns` lists campaigns; `attune campaigns resume ID` resumes one.",
        epilog="environment:\n"
               "  ATTUNE_HOME            campaigns, MLflow's SQLite file, the recipe store (default ./.attune)\n"
               "  ATTUNE_STORE           the recipe store when --store is not given ($ATTUNE_HOME/store)\n"
               "  MLFLOW_TRACKING_URI    MLflow when --mlflow-uri is not given\n"
               "  PREFECT_API_URL        a Prefect server (unset: a private API for this command)\n"
               "  PREFECT_LOGGING_LEVEL  INFO brings back Prefect's own logs\n"
               "  OPENAI_API_KEY         the key of --planner llm\n"
               "  ATTUNE_TORCHTITAN_DEPLOYMENT, ATTUNE_TORCHTITAN_LAUNCHER\n"
               "                         run torchtitan trials on a GPU work pool (docs/clusters.md)\n"
               "exit: 0 done; 2 bad input (one line); 130 stopped by Ctrl-C or a cancel, 143 by SIGTERM, state saved.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", metavar="RECIPE", help="recipe TOML file")
    add_settings_arguments(p)
    p.add_argument("--cluster", metavar="ACCEL:COUNT", help="tune for another cluster, e.g. h200:128 "
                                                        "(default: the recipe's [cluster])")
    p.add_argument("--model-spec", metavar="FILE", help="model spec file replacing the recipe's model")
    add_sim_cluster_arguments(p)
    p.add_argument("--mlflow-uri", metavar="URI", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, "
                                                    "else sqlite:///$ATTUNE_HOME/mlflow.db)")
    p.add_argument("--out", metavar="FILE", help="where to write the shipped recipe (default: shipped.toml in the "
                                                 "campaign folder, $ATTUNE_HOME/campaigns/<recipe>-<id>/)")
    p.add_argument("--store", metavar="URI", help="recipe store: a folder or s3://BUCKET/PREFIX (default: "
                                                  "$ATTUNE_STORE, else $ATTUNE_HOME/store)")
    p.add_argument("--llm-base-url", metavar="URL", help="OpenAI-compatible endpoint, required with --planner llm "
                                                         "(the key from $OPENAI_API_KEY)")
    p.add_argument("--llm-model", metavar="MODEL", default=None,
                   help="model name for --planner llm (default: $ATTUNE_LLM_MODEL, else 'default')")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    quiet_local_prefect()
    settings = _settings(args)
    return run_campaign(args.recipe, settings, cluster=args.cluster, model_spec=args.model_spec,
                        mlflow_uri=args.mlflow_uri, out=args.out, store=args.store, quiet=args.quiet, as_json=args.json)


def run_campaign(recipe: str, settings, *, cluster: str | None = None, model_spec: str | None = None,
                 mlflow_uri: str | None = None, out: str | None = None, store: str | None = None,
                 quiet: bool = False, as_json: bool = False) -> int:
    """Run (or resume) a campaign and print its result. Exit 0 with the result; 130 (SIGINT, a cancel
    in Prefect) or 143 (SIGTERM) when stopped, with the state saved: the same command resumes it."""
    quiet_local_prefect()
    from prefect.exceptions import CancelledRun

    from attune import interrupt
    from attune.cli.prefect_api import private_prefect_api
    from attune.flows.campaign import tune_campaign

    try:
        with private_prefect_api():
            result = tune_campaign(recipe, settings, cluster=cluster, model_spec=model_spec, mlflow_uri=mlflow_uri,
                                   out=out, store=store, quiet=quiet)
    except CancelledRun:   # the flow stopped as asked (attune.interrupt), its state saved
        reason = interrupt.requested() or "cancel"
        print(f"attune: stopped by {reason}, state saved; run the same command again to resume", file=sys.stderr)
        return interrupt.EXIT_CODES.get(reason, 130)
    emit(result, as_json, _text(result))
    return 0


def _settings(args: argparse.Namespace):
    """The campaign's settings, and everything that can be refused refused here, before a flow run
    or any file exists: the settings validate themselves; the recipe, the stack's and the planner's
    options are checked by building them."""
    from attune.campaign.engine import check_resumable
    from attune.campaign.inputs import load_campaign_recipe
    from attune.planners.registry import make_planner
    from attune.stacks.registry import make_stack

    planner_options = {"base_url": args.llm_base_url, "model": args.llm_model} if args.planner == "llm" else {}
    stack_options = {}
    if args.stack == "sim":
        stack_options = check_sim_cluster_arguments(args)
        if args.cluster_seed == 0:
            stack_options = {}   # the reference cluster: the default, and the same campaign as before
    elif args.cluster_seed != 0 or args.world != "realistic":
        raise InputError("--cluster-seed/--world", "only the sim stack has simulated clusters")
    settings = settings_from_args(args, stack_options=stack_options, planner_options=planner_options)
    recipe = load_campaign_recipe(args.recipe, args.cluster, args.model_spec)
    stack = make_stack(settings.stack, **settings.stack_options)
    make_planner(settings.planner, seed=settings.seed, disabled_rules=frozenset(settings.disabled_rules),
                 **settings.planner_options)
    check_resumable(recipe, settings, store=getattr(args, "store", None))
    preflight = getattr(stack, "preflight", None)  # a stack that runs trials elsewhere checks it can
    if preflight is not None:
        preflight(recipe)
    return settings


def _text(result: dict) -> str:
    from attune.campaign.budget import hours_text
    label = " [simulated]" if result.get("simulated") else ""
    base, best = result["baseline"], result["best"]
    payback = result.get("payback_hours")
    return "\n".join([
        f"{result['recipe']} on {result['cluster']}{label}: {result['stop_reason']}",
        f"  baseline {base['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU -> best {best['tokens_per_sec_per_gpu']:,.0f} "
        f"({result['gain']:+.1%}, noise band {(result['noise_band'] or 0):.1%})",
        f"  GPU-hours {hours_text(result['gpu_hours_used'])} / {hours_text(result['budget_gpu_hours'])}, "
        f"{result['trials']} trials"
        + (f", pays back after {payback:.1f} h of training" if payback else ""),
        f"  shipped: {result['recipe_out'] or 'no (baseline kept)'}   MLflow run: {result['mlflow_run_id']}",
    ])
