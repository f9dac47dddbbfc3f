"""`attune tune`: run one campaign as a Prefect flow (see flows/campaign.py)."""

from __future__ import annotations

import argparse

from attune.cli.common import add_sim_cluster_arguments, check_sim_cluster_arguments, emit, quiet_local_prefect
from attune.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tune", help="tune a recipe within a GPU-hour budget (a Prefect flow)")
    p.add_argument("recipe", help="recipe TOML file")
    p.add_argument("--budget-gpu-hours", type=float, required=True, metavar="H")
    p.add_argument("--stack", default="sim", help="sim | torchtitan (default sim: the simulated cluster)")
    p.add_argument("--planner", default="attune", help="attune | random | bayes | estimator-topk | grid | llm")
    p.add_argument("--cluster", metavar="ACCEL:COUNT", help="tune for another cluster, e.g. h200:128")
    p.add_argument("--model-spec", metavar="FILE", help="model spec file replacing the recipe's model")
    p.add_argument("--seed", type=int, default=0)
    add_sim_cluster_arguments(p)
    p.add_argument("--steps", type=int, default=10, help="measured steps per trial (default 10)")
    p.add_argument("--replicates", type=int, default=3, help="baseline and confirmation replicates (default 3)")
    p.add_argument("--disable-rule", action="append", default=[], metavar="RULE",
                   help="switch a search rule of the attune planner off (ablations), e.g. oom-recompute, "
                        "recheck, lessons (attune bench --help lists them all)")
    p.add_argument("--gate-steps", type=int, help="steps of each convergence-check run: the proxy's on sim, "
                   "torchtitan's on --stack torchtitan (default: the gate's, 40 and 20)")
    p.add_argument("--mlflow-uri", help="MLflow tracking URI (default: SQLite under .attune/)")
    p.add_argument("--out", help="where to write the shipped recipe (default: in the campaign folder)")
    p.add_argument("--store", help="recipe store: a folder or s3://bucket/prefix (default .attune/store)")
    p.add_argument("--llm-base-url", help="OpenAI-compatible endpoint for --planner llm")
    p.add_argument("--llm-model", default=None, help="model name for --planner llm")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    quiet_local_prefect()
    if args.budget_gpu_hours <= 0:
        raise InputError("--budget-gpu-hours", f"must be > 0, got {args.budget_gpu_hours:g}")
    planner_options = {}
    if args.planner == "llm":
        planner_options = {"base_url": args.llm_base_url, "model": args.llm_model}
    stack_options = _validate(args, planner_options)
    from flows.campaign import tune_campaign

    result = tune_campaign(args.recipe, args.budget_gpu_hours, stack=args.stack, planner=args.planner,
                           cluster=args.cluster, seed=args.seed, steps_per_trial=args.steps,
                           replicates=args.replicates, disabled_rules=args.disable_rule, gate_steps=args.gate_steps,
                           mlflow_uri=args.mlflow_uri, out=args.out, store=args.store, model_spec=args.model_spec,
                           planner_options=planner_options, stack_options=stack_options, quiet=args.quiet)
    emit(result, args.json, _text(result))
    return 0


def _validate(args: argparse.Namespace, planner_options: dict) -> dict:
    """Everything that can be refused is refused here, before a flow run or any file exists; the
    stack's options come back (the simulated cluster's on the sim stack)."""
    from attune.planners.registry import make_planner
    from attune.stacks.registry import make_stack
    from attune.campaign.inputs import load_campaign_recipe

    recipe = load_campaign_recipe(args.recipe, args.cluster, args.model_spec)
    stack_options = {}
    if args.stack == "sim":
        stack_options = check_sim_cluster_arguments(args)
        if args.cluster_seed == 0:
            stack_options = {}   # the reference cluster: the default, and the same campaign as before
    elif args.cluster_seed != 0 or args.world != "realistic":
        raise InputError("--cluster-seed/--world", "only the sim stack has simulated clusters")
    make_stack(args.stack, **stack_options)
    make_planner(args.planner, seed=args.seed, disabled_rules=frozenset(args.disable_rule), **planner_options)
    if args.steps < 1 or args.replicates < 1:
        raise InputError("--steps/--replicates", "must be >= 1")
    if args.gate_steps is not None and args.gate_steps < 2:
        raise InputError("--gate-steps", f"must be >= 2 (a curve needs a slope), got {args.gate_steps}")
    recipe.layout()
    return stack_options


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
