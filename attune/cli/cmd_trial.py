"""`attune trial`: the real stack by hand.

  render RECIPE [--set lever=value ...] [--nnodes N] [--validate] --json  -> {"argv": [...], "env": {...}}
  parse-log LOG --json        -> {"status": "ok|oom|nccl_error|timeout|crash", "steps": [{"step": n, ...}]}
  run RECIPE --steps N        -> one local torchtitan trial (one node), its TrialResult
"""

from __future__ import annotations

import argparse
import math
import shlex
from pathlib import Path

from attune.cli.common import _revalidate, add_recipe_arguments, emit, recipe_from_args
from attune.errors import InputError
from attune.layout import adapt_to_cluster
from attune.recipe import Recipe


def register(subparsers: argparse._SubParsersAction) -> None:
    trial = subparsers.add_parser("trial", help="render, run and parse real torchtitan trials")
    sub = trial.add_subparsers(dest="trial_command", metavar="ACTION", required=True)

    render = sub.add_parser("render", help="the torchrun launch of a recipe: argv and env")
    add_recipe_arguments(render)
    render.add_argument("--nnodes", type=int, metavar="N", help="run on N nodes (gpus = N x gpus_per_node; "
                                                                "default: the recipe's gpus)")
    render.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="rendezvous endpoint (multi-node)")
    render.add_argument("--rdzv-id", metavar="ID", help="rendezvous id (default attune-<recipe name>)")
    render.add_argument("--validate", action="store_true", help="check it with torchtitan's ConfigManager")
    render.set_defaults(func=_render)

    parse = sub.add_parser("parse-log", help="metrics lines and the ending of a torchtitan log")
    parse.add_argument("log", metavar="LOG", help="log file")
    parse.add_argument("--returncode", type=int, metavar="N", help="the run's exit code, if known")
    parse.add_argument("--json", action="store_true", help="print JSON")
    parse.set_defaults(func=_parse_log)

    run = sub.add_parser("run", help="one local trial on this machine's GPUs (one node)")
    add_recipe_arguments(run)
    run.add_argument("--steps", type=int, default=20, metavar="N", help="measured steps (after the warm-up; default 20)")
    run.add_argument("--warmup", type=int, default=3, metavar="N", help="steps not measured (compile, warm-up; default 3)")
    run.add_argument("--seed", type=int, default=0, metavar="N", help="the trial's seed (default 0)")
    run.add_argument("--workdir", default="attune-trial", metavar="DIR", help="logs and outputs go here "
                                                                             "(default ./attune-trial)")
    run.add_argument("--smoke-assets", action="store_true", default=None,
                     help="use the shipped offline tokenizer and text (always on for a cpu cluster)")
    run.set_defaults(func=_run)


def _with_nnodes(recipe: Recipe, nnodes: int | None) -> Recipe:
    if nnodes is None:
        return recipe
    if nnodes < 1:
        raise InputError("--nnodes", f"must be a positive integer, got {nnodes}")
    cluster = recipe.cluster.model_copy(update={"gpus": nnodes * recipe.cluster.gpus_per_node})
    config, _changes = adapt_to_cluster(recipe.config, recipe.architecture, cluster)
    return _revalidate(recipe.on_cluster(cluster).with_config(config), "--nnodes")


def _render(args: argparse.Namespace) -> int:
    from attune.stacks.torchtitan.render import render_launch
    recipe = _with_nnodes(recipe_from_args(args), args.nnodes)
    launch = render_launch(recipe, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id)
    if args.validate:
        from attune.stacks.torchtitan.validate import torchtitan_available, validate_train_args
        if not torchtitan_available():
            raise InputError("--validate", "torchtitan is not installed here (pip install -e '.[torchtitan]')")
        validate_train_args(launch.train_args, origin=args.recipe)
    text = "\n".join([f"{k}={shlex.quote(v)}" for k, v in launch.env.items()] + [shlex.join(launch.argv)])
    emit(launch.payload(), args.json, text)
    return 0


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _parse_log(args: argparse.Namespace) -> int:
    from attune.stacks.torchtitan.log_parser import parse_log
    path = Path(args.log)
    if not path.is_file():
        raise InputError(args.log, "log file not found")
    parsed = parse_log(path.read_text(errors="replace"), returncode=args.returncode)
    steps = [{k: (_finite(v) if isinstance(v, float) else v) for k, v in s.model_dump().items()} for s in parsed.steps]
    payload = {"status": parsed.status.value, "steps": steps}
    text = "\n".join([f"{parsed.status.value}: {parsed.message}"] + [
        f"step {s['step']:>5}  loss {s['loss']}  tps {s['tps']}  mfu {s['mfu']}  memory {s['memory_gib']} GiB"
        for s in steps])
    emit(payload, args.json, text)
    return 0


def _run(args: argparse.Namespace) -> int:
    from attune.stacks.torchtitan.stack import TorchtitanStack
    recipe = recipe_from_args(args)
    stack = TorchtitanStack(warmup_steps=args.warmup, smoke_assets=args.smoke_assets)
    stack.preflight(recipe)
    result = stack.run_trial(recipe, steps=args.steps, seed=args.seed, workdir=Path(args.workdir))
    payload = result.model_dump(mode="json", exclude={"steps"}) | {"gpu_hours": result.gpu_hours}
    text = (f"{result.status.value}: tps/gpu {result.tokens_per_sec_per_gpu}  mfu {result.mfu}  "
            f"peak memory {result.peak_memory_gib} GiB  wall {result.wall_time_s:.0f} s  "
            f"{result.gpu_hours:.4f} GPU-h  {result.message}")
    emit(payload, args.json, text)
    return 0 if result.ok else 1
