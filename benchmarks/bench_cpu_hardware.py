"""The planners on real hardware: torchtitan on this machine's CPU, scored against a measured oracle.

    .venv/bin/python benchmarks/bench_cpu_hardware.py sweep        # every layout once, real runs (~1 h on 2 cores)
    .venv/bin/python benchmarks/bench_cpu_hardware.py campaigns    # 4 planners x 3 seeds, replayed (~1 min)
    .venv/bin/python benchmarks/bench_cpu_hardware.py report       # the tables again, from the saved files

1. sweep: every layout of benchmarks/cpu/llama3_debug_search.toml's lever space (DP shard or
   replicate, TP 2, PP 2 under three schedules, local batch, recomputation, compile: 88 layouts) is
   a real torchtitan run on cpu:2 (2 warm-up + 4 measured steps). One JSON line per layout goes to
   sweep.jsonl as soon as it is measured, so a stopped sweep resumes where it was. The sweep of
   2026-12-06 is shipped (benchmarks/cpu/sweep-cpu2-2026-12-06.jsonl): `campaigns` replays it. The best layout
   that fits the recipe's memory limit is the measured oracle.
2. campaigns: `attune`, `random`, `bayes-warm` and `estimator-topk` each run a whole campaign (the
   real campaign flow, protocol and gate) 3 times, on the `measured` stack, which replays the sweep's
   runs: a trial of a layout returns that layout's measured step times resampled with the trial's
   seed (its run-to-run noise is the measured step-to-step spread), charged start-up plus steps as
   measured. Planners see what they measure and the public estimator only, as on any stack.
3. Scored against the measured oracle: the share of the oracle's throughput each campaign ships,
   process-hours used, and whether it shipped a layout slower than the baseline (a false gain).

Figures are measured on this machine (2 cores): the sweep is real; the campaigns replay it. Where
the public estimator is wrong about a CPU is printed too (its rank of the oracle, the correlation of
its predicted against measured throughput).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from attune.recipe import load_recipe  # noqa: E402
from attune.space import iter_layouts, recipe_at  # noqa: E402
from attune.stacks.measured import MeasuredTable, layout_key  # noqa: E402

RECIPE = REPO / "benchmarks" / "cpu" / "llama3_debug_search.toml"
# The sweep measured on this machine (2 cores, 2026-12-06), shipped so the campaigns replay without it
TABLE = REPO / "benchmarks" / "cpu" / "sweep-cpu2-2026-12-06.jsonl"
OUT = REPO / ".attune" / "bench-cpu-hardware"
PLANNERS = ("attune", "random", "bayes-warm", "estimator-topk")
WARMUP, MEASURED = 2, 4
SWEEP_MEMORY_GIB = 8.0   # the sweep records each layout's true peak; the replay applies the recipe's limit


def sweep(out: Path) -> None:
    from attune.stacks.torchtitan.stack import TorchtitanStack
    recipe = load_recipe(RECIPE)
    roomy = recipe.on_cluster(recipe.cluster.model_copy(update={"hbm_gib": SWEEP_MEMORY_GIB}))
    table_path = out / "sweep.jsonl"
    done = {layout_key(r["levers"]) for r in MeasuredTable.read(table_path)} if table_path.is_file() else set()
    layouts = list(iter_layouts(recipe))
    stack = TorchtitanStack(warmup_steps=WARMUP)
    started = time.monotonic()
    for i, layout in enumerate(layouts, 1):
        levers = layout.levers()
        if layout_key(levers) in done:
            continue
        workdir = out / "runs" / f"layout-{i:03d}"
        result = stack.run_trial(recipe_at(roomy, levers), steps=MEASURED, seed=0, workdir=workdir)
        timed = [s for s in result.steps if s.step > WARMUP and s.tps]
        record = {"levers": levers, "status": result.status.value, "wall_time_s": result.wall_time_s,
                  "tokens_per_sec_per_gpu": result.tokens_per_sec_per_gpu, "peak_memory_gib": result.peak_memory_gib,
                  "step_tps": [s.tps for s in timed], "losses": [s.loss for s in result.steps],
                  "steps_logged": len(result.steps), "warmup_steps": WARMUP, "message": result.message[-300:]}
        with table_path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        elapsed = time.monotonic() - started
        print(f"[{i}/{len(layouts)}] {_short(levers)}: {result.status.value} "
              f"{result.tokens_per_sec_per_gpu or 0:.0f} tok/s/proc, peak {result.peak_memory_gib or 0:.2f} GiB, "
              f"{result.wall_time_s:.0f} s  ({elapsed / 60:.0f} min so far)", flush=True)


def _short(levers: dict) -> str:
    names = {"parallelism.tensor_parallel_degree": "tp", "parallelism.pipeline_parallel_degree": "pp",
             "parallelism.data_parallel_replicate_degree": "dpr", "parallelism.data_parallel_shard_degree": "dps",
             "training.local_batch_size": "lb", "activation_checkpoint.mode": "ac", "compile.enable": "compile",
             "parallelism.pipeline_parallel_schedule": "sched"}
    pp = levers.get("parallelism.pipeline_parallel_degree", 1) > 1
    return " ".join(f"{short}={levers[key]}" for key, short in names.items()
                    if key in levers and (short != "sched" or pp))


def campaigns(out: Path, budget: float, seeds: int, planners: tuple[str, ...], recipe_path: Path = RECIPE,
              table: Path = TABLE) -> None:
    from attune.campaign.context import CampaignSettings
    from flows.campaign import tune_campaign
    os.environ["ATTUNE_HOME"] = str(out / "home")
    rows_path = _rows_path(out, budget, recipe_path)
    done = {(r["planner"], r["seed"]) for r in _jsonl(rows_path)}
    for planner in planners:
        for seed in range(seeds):
            if (planner, seed) in done:
                continue
            started = time.monotonic()
            settings = CampaignSettings(stack="measured", planner=planner, seed=seed, budget_gpu_hours=budget,
                                        stack_options={"table": str(table)})
            result = tune_campaign(str(recipe_path), settings, quiet=True)
            row = _row(planner, seed, budget, result, time.monotonic() - started)
            with rows_path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(f"{planner} seed {seed}: {'shipped ' + _short(row['levers']) if row['shipped'] else 'kept the baseline'} "
                  f"(measured {100 * row['measured_gain']:+.0f}%), {row['used']:.3f} of {budget:g} process-hours, "
                  f"{row['trials']} runs, {row['seconds']:.0f} s", flush=True)


def _row(planner: str, seed: int, budget: float, result, seconds: float) -> dict:
    data = result if isinstance(result, dict) else result.result()   # the flow returns the result dict
    shipped = data["best"]["levers"] if data["shipped"] else None
    return {"planner": planner, "seed": seed, "budget": budget, "shipped": data["shipped"], "levers": shipped,
            "measured_gain": data["gain"], "used": data["gpu_hours_used"], "trials": data["trials"],
            "stop_reason": data["stop_reason"], "protocol": data["protocol"]["why"], "seconds": seconds}


def _rows_path(out: Path, budget: float, recipe_path: Path) -> Path:
    suffix = "" if recipe_path == RECIPE else f"-{recipe_path.stem}"
    return out / f"campaigns-{budget:g}{suffix}.jsonl"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def report(out: Path, budget: float, recipe_path: Path = RECIPE, table_path: Path = TABLE) -> None:
    recipe = load_recipe(recipe_path)
    table = MeasuredTable(table_path)
    limit = recipe.cluster.memory_gib
    fits = {k: r for k, r in table.records.items() if table.fits(r, limit)}
    ok = {k: r for k, r in fits.items() if r["status"] == "ok" and table.tps(r)}
    oracle_key = max(ok, key=lambda k: table.tps(ok[k]))
    oracle = ok[oracle_key]
    oracle_tps = table.tps(oracle)
    base_tps = table.tps(table.record(recipe.layout().levers()))
    statuses = [r["status"] if table.fits(r, limit) else "oom" for r in table.records.values()]
    print(f"## CPU hardware benchmark (measured on this machine: {os.cpu_count()} cores, torchtitan 0.3 debug model, cpu:2)\n")
    print(f"- sweep: {len(table.records)} layouts, {sum(s == 'ok' for s in statuses)} ran, "
          f"{statuses.count('oom')} over the {limit:g} GiB per-process limit, "
          f"{len(statuses) - statuses.count('ok') - statuses.count('oom')} failed otherwise; "
          f"{sum(r['wall_time_s'] for r in table.records.values()) / 60:.0f} min of runs")
    print(f"- baseline {base_tps:.0f} tok/s/proc; measured oracle {oracle_tps:.0f} "
          f"(+{100 * (oracle_tps / base_tps - 1):.0f}%): {_short(oracle['levers'])}")
    _estimator_view(recipe, {k: table.tps(r) for k, r in ok.items()}, {k: r["levers"] for k, r in ok.items()},
                    oracle_key)
    rows = _jsonl(_rows_path(out, budget, recipe_path))
    if not rows:
        return
    print(f"\n| planner | seeds | mean share of the oracle | worst seed | mean gain over baseline | "
          f"process-hours used (of {budget:g}) | false gains |")
    print("|---|---|---|---|---|---|---|")
    for planner in dict.fromkeys(r["planner"] for r in rows):
        mine = [r for r in rows if r["planner"] == planner]
        tps = [table.tps(table.record(r["levers"])) if r["levers"] else base_tps for r in mine]
        shares = [t / oracle_tps for t in tps]
        false = sum(t < base_tps for t in tps)
        print(f"| {planner} | {len(mine)} | {100 * statistics.mean(shares):.1f}% | {100 * min(shares):.1f}% | "
              f"{100 * (statistics.mean(tps) / base_tps - 1):+.1f}% | {statistics.mean(r['used'] for r in mine):.3f} | "
              f"{false} |")


def _estimator_view(recipe, measured: dict, levers: dict, oracle_key: str) -> None:
    """Where the public estimator (what planners consult before measuring) is wrong about a CPU."""
    from scipy.stats import spearmanr

    from attune.sim.estimator import estimate
    predicted = {k: estimate(recipe_at(recipe, levers[k])).tokens_per_sec_per_gpu for k in measured}
    keys = list(measured)
    rho = spearmanr([predicted[k] for k in keys], [measured[k] for k in keys]).statistic
    ranked = sorted(keys, key=lambda k: -predicted[k])
    print(f"- public estimator: rank correlation with measured throughput {rho:+.2f}; it ranks the measured "
          f"oracle #{ranked.index(oracle_key) + 1} of {len(keys)}; its own top pick measures "
          f"{measured[ranked[0]]:.0f} tok/s/proc ({_short(levers[ranked[0]])})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=("sweep", "campaigns", "report"))
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--table", help=f"the measured runs to replay (default: {TABLE.relative_to(REPO)}; "
                                   f"`sweep` writes OUT/sweep.jsonl and replays that)")
    p.add_argument("--budget", type=float, default=0.25, help="process-hours per campaign (default 0.25)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--planners", default=",".join(PLANNERS))
    p.add_argument("--recipe", default=str(RECIPE), help="the same space under other limits (default the sweep's "
                                                        "recipe); e.g. benchmarks/cpu/llama3_debug_search_tight.toml")
    a = p.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    table = Path(a.table).resolve() if a.table else (out / "sweep.jsonl" if a.step == "sweep" else TABLE)
    if a.step == "sweep":
        sweep(out)
    elif a.step == "campaigns":
        campaigns(out, a.budget, a.seeds, tuple(a.planners.split(",")), Path(a.recipe).resolve(), table)
    report(out, a.budget, Path(a.recipe).resolve(), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
