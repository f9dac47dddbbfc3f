"""`attune sim predict` and `attune sim oracle`: the simulated cluster from the command line.

predict: one layout's step on the ground truth (with one run's noise, from --seed) or, with
--estimator, from the public estimator. oracle: the best layout of the recipe's lever space on
the ground truth, noise off. Everything printed is simulated and says so.
"""

from __future__ import annotations

import argparse
import sys
import time

from attune.cli.common import add_recipe_arguments, add_sim_cluster_arguments, check_sim_cluster_arguments, emit, \
    recipe_from_args
from attune.errors import InputError
from attune.sim.estimator import estimate
from attune.sim.ground_truth import measure
from attune.sim.oracle import oracle
from attune.sim.worlds import cluster_text


def register(subparsers: argparse._SubParsersAction) -> None:
    sim = subparsers.add_parser("sim", help="the simulated cluster: predict a layout's step, or find the best layout")
    sub = sim.add_subparsers(dest="sim_command", metavar="ACTION", required=True)

    predict = sub.add_parser("predict", help="step time, throughput, memory and breakdown of the recipe's layout")
    add_recipe_arguments(predict)
    predict.add_argument("--seed", type=int, default=0, metavar="N", help="run-to-run noise seed of the simulated run (default 0)")
    predict.add_argument("--estimator", action="store_true", help="use the public estimator instead of the ground truth")
    add_sim_cluster_arguments(predict)
    predict.set_defaults(func=_predict)

    orc = sub.add_parser("oracle", help="exhaustive search of the lever space on the ground truth (noise off)")
    add_recipe_arguments(orc, with_set=False)
    add_sim_cluster_arguments(orc)
    orc.set_defaults(func=_oracle)


def _check_seeds(args: argparse.Namespace) -> None:
    if getattr(args, "seed", 0) < 0:
        raise InputError("--seed", f"must be >= 0, got {args.seed}")
    check_sim_cluster_arguments(args)


def _where(args: argparse.Namespace) -> str:
    return cluster_text(args.cluster_seed, args.world)


def _predict(args: argparse.Namespace) -> int:
    _check_seeds(args)
    recipe = recipe_from_args(args)
    if args.estimator:
        result = estimate(recipe)
    else:
        result = measure(recipe, cluster_seed=args.cluster_seed, noise_seed=args.seed, world=args.world)
    payload = result.model_dump()
    b = result.breakdown
    comm = ", ".join(f"{k} {v:.3f}" for k, v in b["exposed_comm_s"].items() if v > 0) or "none"
    mem = ", ".join(f"{k} {v:.1f}" for k, v in b["memory_gib"].items())
    text = "\n".join([
        f"{recipe.name}: {recipe.model_name} on {recipe.cluster.label} (simulated, {result.source}"
        + (")" if args.estimator else f", {_where(args)})"),
        f"  fits             {'yes' if result.fits else 'NO (out of memory)'}",
        f"  peak memory      {result.peak_memory_gib:.1f} GiB of {b['hbm_gib']:g} GiB ({mem})",
        f"  step time        {result.step_time_s:.3f} s",
        f"  tokens/s/GPU     {result.tokens_per_sec_per_gpu:,.0f}",
        f"  MFU              {result.mfu:.1%}",
        f"  compute          {b['compute_s']:.3f} s, recompute {b['recompute_s']:.3f} s, bubble {b['bubble_s']:.3f} s, "
        f"optimizer {b['optimizer_s']:.3f} s, other {b['other_s']:.3f} s",
        f"  exposed comm     {comm}",
    ])
    emit(payload, args.json, text)
    return 0


def _oracle(args: argparse.Namespace) -> int:
    _check_seeds(args)
    recipe = recipe_from_args(args)
    t0, shown = time.perf_counter(), [False]

    def progress(evaluated: int) -> None:
        if not args.json and sys.stderr.isatty() and time.perf_counter() - t0 > 1.5:
            sys.stderr.write(f"\roracle: {evaluated:,} layouts evaluated ...")
            shown[0] = True

    result = oracle(recipe, cluster_seed=args.cluster_seed, progress=progress, world=args.world)
    if shown[0]:
        sys.stderr.write("\n")
    best = result.best
    payload = {"best": None if best is None else {"levers": best.levers, "tokens_per_sec_per_gpu": best.tokens_per_sec_per_gpu,
                                                  "step_time_s": best.step_time_s, "peak_memory_gib": best.peak_memory_gib,
                                                  "mfu": best.mfu},
               "evaluated": result.evaluated, "fitting": result.fitting, "seconds": result.seconds,
               "cluster_seed": result.cluster_seed, "world": result.world, "simulated": True}
    if best is None:
        text = (f"oracle: no layout of {recipe.name} fits on {recipe.cluster.label}: {result.evaluated:,} evaluated "
                f"in {result.seconds:.1f} s (simulated, {_where(args)})")
    else:
        lines = [f"  {k} = {v}" for k, v in best.levers.items()]
        text = "\n".join(lines + [
            f"oracle: best {best.tokens_per_sec_per_gpu:,.1f} tokens/s/GPU (MFU {best.mfu:.1%}, "
            f"{best.peak_memory_gib:.1f} GiB) on {recipe.cluster.label}; {result.evaluated:,} layouts evaluated "
            f"({result.fitting:,} fit) in {result.seconds:.1f} s (simulated, {_where(args)})"])
    emit(payload, args.json, text)
    return 0
