"""The planners on real hardware: torchtitan on this machine's CPU, scored against measured oracles.

    .venv/bin/python benchmarks/bench_cpu_hardware.py campaigns --json           # every world not frozen, replayed
    .venv/bin/python benchmarks/bench_cpu_hardware.py campaigns --worlds seq256-memory --json   # the frozen one
    .venv/bin/python benchmarks/bench_cpu_hardware.py report                     # the tables again, from saved rows
    .venv/bin/python benchmarks/bench_cpu_hardware.py sweep --world seq512       # measure a world again (~45 min)

The worlds are listed in benchmarks/cpu/worlds.toml: each is a recipe of the llama3 debug model on
cpu:2 whose [search] table is a lever space small enough to run every layout (DP shard or replicate,
TP 2, PP 2, CP 2 where the sequence allows, local batch, recomputation, compile), and whose hbm_gib
is a per-process memory limit.

1. sweep: every layout of a world's space is a real torchtitan run (2 warm-up + 4 measured steps),
   twice, in two passes (every layout once, then every layout again), so what changes on the
   machine over the sweep shows as run-to-run spread rather than as a difference between layouts.
   One JSON line per run goes to the world's table as soon as it is measured (a stopped sweep
   resumes); the tables are shipped in benchmarks/cpu/. The best layout that fits the recipe's
   memory limit, every run of it ok, by the mean of its runs' median steps, is the measured oracle.
2. campaigns: `attune`, `random`, `bayes-warm` and `estimator-topk` each run a whole campaign (the
   real campaign flow, protocol and gate) 3 times per world at 0.25 process-hours, on the `measured`
   stack: a trial of a layout replays one of its runs, drawn with the trial's seed (run-to-run
   noise), its steps resampled (step-to-step noise), charged start-up plus steps as measured.
   Planners see what they measure and the public estimator only, as on any stack.
3. Scored against the measured oracle: the share of its throughput each campaign ships (mean and
   worst seed), the mean gain over the baseline, process-hours used, and false gains (a shipped
   layout slower than the baseline, as measured). `--json` prints
   {"worlds": [{"name", "oracle_gain", "planners": {NAME: {"share_mean", "share_worst", "gain_mean",
   "used_mean", "false_gains"}}}]}.

Figures are measured on this machine (2 cores): the sweeps are real; the campaigns replay them.
Where the public estimator is wrong about a CPU is printed too (its rank of the oracle, the rank
correlation of its predicted against measured throughput).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from attune.recipe import load_recipe  # noqa: E402
from attune.space import iter_layouts, recipe_at  # noqa: E402
from attune.stacks.measured import MeasuredTable, layout_key  # noqa: E402

CPU_DIR = REPO / "benchmarks" / "cpu"
WORLDS = CPU_DIR / "worlds.toml"
RECIPE = CPU_DIR / "llama3_debug_search.toml"
# The sweep measured on this machine (2 cores, 2026-12-06), shipped so the campaigns replay without it
TABLE = REPO / "benchmarks" / "cpu" / "sweep-cpu2-2026-12-06.jsonl"
OUT = REPO / ".attune" / "bench-cpu-hardware"
PLANNERS = ("attune", "random", "bayes-warm", "estimator-topk")
WARMUP, MEASURED = 2, 4
SWEEP_MEMORY_GIB = 8.0   # the sweep records each layout's true peak; the replay applies the recipe's limit


def load_worlds() -> dict[str, dict]:
    """benchmarks/cpu/worlds.toml: name -> recipe path, table path, frozen, note."""
    import tomllib
    raw = tomllib.loads(WORLDS.read_text())["worlds"]
    return {name: {"name": name, "recipe": CPU_DIR / w["recipe"], "table": CPU_DIR / w["table"],
                   "frozen": bool(w.get("frozen", False)), "note": w.get("note", ""),
                   "run_sd": float(w.get("run_sd", 0.0))} for name, w in raw.items()}


def sweep(out: Path, recipe_path: Path = RECIPE, runs: int = 1, table_path: Path | None = None) -> Path:
    """Every layout of the recipe's space run `runs` times, in passes (every layout once, then every
    layout again), so that what changes on the machine over the sweep shows as run-to-run spread
    rather than as a difference between layouts. Appends to the table as it goes: a stopped sweep
    resumes where it was."""
    from attune.stacks.torchtitan.stack import TorchtitanStack
    recipe = load_recipe(recipe_path)
    roomy = recipe.on_cluster(recipe.cluster.model_copy(update={"hbm_gib": SWEEP_MEMORY_GIB}))
    table_path = table_path or out / "sweep.jsonl"
    done = ({(layout_key(r["levers"]), int(r.get("run", 0))) for r in MeasuredTable.read(table_path)}
            if table_path.is_file() else set())
    layouts = list(iter_layouts(recipe))
    stack = TorchtitanStack(warmup_steps=WARMUP)
    started = time.monotonic()
    for run in range(runs):
        for i, layout in enumerate(layouts, 1):
            levers = layout.levers()
            if (layout_key(levers), run) in done:
                continue
            workdir = out / "runs" / f"run{run}-layout-{i:03d}"
            result = stack.run_trial(recipe_at(roomy, levers), steps=MEASURED, seed=run, workdir=workdir)
            timed = [s for s in result.steps if s.step > WARMUP and s.tps]
            record = {"levers": levers, "run": run, "status": result.status.value, "wall_time_s": result.wall_time_s,
                      "tokens_per_sec_per_gpu": result.tokens_per_sec_per_gpu,
                      "peak_memory_gib": result.peak_memory_gib, "step_tps": [s.tps for s in timed],
                      "losses": [s.loss for s in result.steps], "steps_logged": len(result.steps),
                      "warmup_steps": WARMUP, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "message": result.message[-300:]}
            with table_path.open("a") as fh:
                fh.write(json.dumps(record) + "\n")
            shutil.rmtree(workdir, ignore_errors=True)   # the record holds what a replay needs
            elapsed = time.monotonic() - started
            print(f"[run {run + 1}/{runs}, {i}/{len(layouts)}] {_short(levers)}: {result.status.value} "
                  f"{result.tokens_per_sec_per_gpu or 0:.0f} tok/s/proc, peak {result.peak_memory_gib or 0:.2f} GiB, "
                  f"{result.wall_time_s:.0f} s  ({elapsed / 60:.0f} min so far)", flush=True)
    return table_path


def _short(levers: dict) -> str:
    names = {"parallelism.tensor_parallel_degree": "tp", "parallelism.pipeline_parallel_degree": "pp",
             "parallelism.data_parallel_replicate_degree": "dpr", "parallelism.data_parallel_shard_degree": "dps",
             "training.local_batch_size": "lb", "activation_checkpoint.mode": "ac", "compile.enable": "compile",
             "parallelism.pipeline_parallel_schedule": "sched"}
    pp = levers.get("parallelism.pipeline_parallel_degree", 1) > 1
    return " ".join(f"{short}={levers[key]}" for key, short in names.items()
                    if key in levers and (short != "sched" or pp))


def campaigns(out: Path, world: dict, budget: float, seeds: int, planners: list, say=print,
              ledger: Path | None = None) -> Path:
    """Every planner x seed campaign on one world, replayed on its table, afresh (the rows of an
    earlier run and its campaigns are replaced: a campaign of the same identity would resume).
    Each campaign has a recipe store of its own, so none learns lessons from another's moves; with
    `ledger` (a store folder), each starts from a copy of that store's lessons ledger."""
    from attune.campaign.context import CampaignSettings
    from flows.campaign import tune_campaign
    folder = out / world["name"]
    shutil.rmtree(folder / "home", ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["ATTUNE_HOME"] = str(folder / "home")
    rows_path = folder / f"campaigns-{budget:g}.jsonl"
    rows_path.unlink(missing_ok=True)
    for variant in planners:
        planner = variant.label
        for seed in range(seeds):
            started = time.monotonic()
            store = folder / "stores" / f"{planner}-{seed}"
            shutil.rmtree(store, ignore_errors=True)
            if ledger is not None:
                shutil.copytree(ledger, store)
            os.environ["ATTUNE_STORE"] = str(store)
            options = {"table": str(world["table"])} | ({"run_sd": world["run_sd"]} if world["run_sd"] else {})
            settings = CampaignSettings(stack="measured", planner=variant.planner, seed=seed, budget_gpu_hours=budget,
                                        stack_options=options, disabled_rules=list(variant.disabled_rules))
            result = tune_campaign(str(world["recipe"]), settings, quiet=True)
            row = _row(planner, seed, budget, result, time.monotonic() - started)
            with rows_path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            say(f"{world['name']}: {planner} seed {seed}: "
                f"{'shipped ' + _short(row['levers']) if row['shipped'] else 'kept the baseline'} "
                f"(measured {100 * row['measured_gain']:+.0f}%), {row['used']:.3f} of {budget:g} process-hours, "
                f"{row['trials']} runs, {row['seconds']:.0f} s")
    return rows_path


def planner_variants(text: str, ablations: bool = False) -> list:
    """The planners to run (attune.bench.request.parse_planners: `attune-no-RULE` is attune with that
    rule off); `ablations` adds one such variant per search rule of the attune planner."""
    from attune.bench.request import ABLATION_PREFIX, parse_planners
    from attune.planners.attune_planner import SEARCH_RULES
    if ablations:
        text = ",".join([text, *(ABLATION_PREFIX + rule for rule in SEARCH_RULES)])
    return parse_planners(text)


def _row(planner: str, seed: int, budget: float, result, seconds: float) -> dict:
    data = result if isinstance(result, dict) else result.result()   # the flow returns the result dict
    shipped = data["best"]["levers"] if data["shipped"] else None
    state = json.loads((Path(data["campaign_dir"]) / "state.json").read_text())
    confirmed = [t["levers"] for t in state["trials"] if t["role"] == "confirm"]
    return {"planner": planner, "seed": seed, "budget": budget, "shipped": data["shipped"], "levers": shipped,
            "candidate": confirmed[-1] if confirmed else shipped,
            "measured_gain": data["gain"], "used": data["gpu_hours_used"], "trials": data["trials"],
            "stop_reason": data["stop_reason"], "protocol": data["protocol"]["why"], "seconds": seconds,
            "campaign_dir": data["campaign_dir"]}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def oracle(world: dict) -> dict:
    """The world's measured oracle: the best layout that fits the recipe's memory limit, every run ok."""
    recipe = load_recipe(world["recipe"])
    table = MeasuredTable(world["table"])
    limit = recipe.cluster.memory_gib
    layouts = [layout.levers() for layout in iter_layouts(recipe)]
    tps = {layout_key(lv): table.layout_tps(lv) for lv in layouts}
    ok = {layout_key(lv): lv for lv in layouts if tps[layout_key(lv)] and table.fits(lv, limit)}
    best = max(ok, key=lambda k: tps[k])
    base = table.layout_tps(recipe.layout().levers())
    failed = sum(1 for lv in layouts if tps[layout_key(lv)] is None)
    over = sum(1 for lv in layouts if tps[layout_key(lv)] and not table.fits(lv, limit))
    return {"recipe": recipe, "table": table, "layouts": layouts, "tps": tps, "ok": ok, "best": ok[best],
            "oracle_tps": tps[best], "baseline_tps": base, "oracle_gain": tps[best] / base - 1, "failed": failed,
            "over_limit": over, "runs": sum(len(v) for v in table.records.values()),
            "minutes": sum(r["wall_time_s"] for v in table.records.values() for r in v) / 60,
            "run_to_run_sd": table.run_to_run_sd()}


def score(world: dict, rows: list[dict]) -> dict:
    """Per planner: mean and worst share of the measured oracle, mean gain, process-hours used, and
    false gains (a shipped layout slower, as measured, than the baseline)."""
    o = oracle(world)
    planners = {}
    for planner in dict.fromkeys(r["planner"] for r in rows):
        mine = [r for r in rows if r["planner"] == planner]
        tps = [o["table"].layout_tps(r["levers"]) if r["levers"] else o["baseline_tps"] for r in mine]
        shares = [t / o["oracle_tps"] for t in tps]
        found = [(o["table"].layout_tps(r["candidate"]) or 0.0) if r.get("candidate") else o["baseline_tps"]
                 for r in mine]
        planners[planner] = {"seeds": len(mine), "share_mean": statistics.mean(shares), "share_worst": min(shares),
                             "gain_mean": statistics.mean(tps) / o["baseline_tps"] - 1,
                             "used_mean": statistics.mean(r["used"] for r in mine),
                             "false_gains": sum(t < o["baseline_tps"] for t in tps),
                             # what the search took to its confirmation, shipped or not (the confirmation
                             # test, the same for every planner, keeps the baseline when it cannot tell)
                             "found_mean": statistics.mean(f / o["oracle_tps"] for f in found),
                             "kept_baseline": sum(not r["shipped"] for r in mine)}
    return {"name": world["name"], "frozen": world["frozen"], "oracle_gain": o["oracle_gain"],
            "budget": rows[0]["budget"] if rows else None, "planners": planners}


def report(out: Path, world: dict, budget: float) -> dict:
    """The world's tables (markdown on stdout) and its scores."""
    o = oracle(world)
    print(f"## {world['name']}{' (frozen until the planner was done)' if world['frozen'] else ''}: {world['note']}\n")
    print(f"- sweep: {len(o['layouts'])} layouts, {o['runs']} runs ({o['minutes']:.0f} min), "
          f"{len(o['ok'])} ran within the {o['recipe'].cluster.memory_gib:g} GiB per-process limit, "
          f"{o['over_limit']} above it, {o['failed']} failed; run-to-run spread {o['run_to_run_sd']:.1%}")
    print(f"- baseline {o['baseline_tps']:.0f} tok/s/proc; measured oracle {o['oracle_tps']:.0f} "
          f"({o['oracle_gain']:+.0%}): {_short(o['best'])}")
    _estimator_view(o)
    rows = _jsonl(out / world["name"] / f"campaigns-{budget:g}.jsonl")
    scored = score(world, rows)
    if rows:
        print(f"\n| planner | seeds | mean share of the oracle | worst seed | mean gain over baseline | "
              f"process-hours used (of {budget:g}) | false gains | kept the baseline | searched to (share) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for planner, p in scored["planners"].items():
            print(f"| {planner} | {p['seeds']} | {p['share_mean']:.1%} | {p['share_worst']:.1%} | "
                  f"{p['gain_mean']:+.1%} | {p['used_mean']:.3f} | {p['false_gains']} | {p['kept_baseline']} | "
                  f"{p['found_mean']:.1%} |")
    print()
    return scored


def _estimator_view(o: dict) -> None:
    """Where the public estimator (what planners consult before measuring) is wrong about a CPU."""
    from scipy.stats import spearmanr

    from attune.sim.estimator import estimate
    keys = list(o["ok"])
    predicted = {k: estimate(recipe_at(o["recipe"], o["ok"][k])).tokens_per_sec_per_gpu for k in keys}
    rho = spearmanr([predicted[k] for k in keys], [o["tps"][k] for k in keys]).statistic
    ranked = sorted(keys, key=lambda k: -predicted[k])
    best = layout_key(o["best"])
    print(f"- public estimator: rank correlation with measured throughput {rho:+.2f}; it ranks the measured "
          f"oracle #{ranked.index(best) + 1} of {len(keys)}; its own top pick measures "
          f"{o['tps'][ranked[0]]:.0f} tok/s/proc ({_short(o['ok'][ranked[0]])})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=("sweep", "campaigns", "report"))
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--worlds", help="comma-separated worlds of benchmarks/cpu/worlds.toml (default: every one not "
                                    "frozen; a frozen world only when named)")
    p.add_argument("--world", help="sweep: the world to measure (its recipe; its table under benchmarks/cpu/ is "
                                   "appended to)")
    p.add_argument("--runs", type=int, default=2, help="sweep: runs per layout, in passes (default 2)")
    p.add_argument("--budget", type=float, default=0.25, help="process-hours per campaign (default 0.25)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--planners", default=",".join(PLANNERS),
                   help="comma-separated; attune-no-RULE is attune with one rule off (an ablation)")
    p.add_argument("--ablations", action="store_true",
                   help="campaigns: add attune-no-RULE for every search rule of the attune planner")
    p.add_argument("--json", action="store_true", help="campaigns, report: the scores as JSON on stdout "
                                                        "(the tables and progress go to stderr)")
    a = p.parse_args()
    from attune.errors import InputError
    try:
        planners = planner_variants(a.planners, a.ablations)
    except InputError as err:
        p.error(str(err))
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    worlds = load_worlds()
    if a.step == "sweep":
        if not a.world or a.world not in worlds:
            p.error(f"sweep needs --world, one of {', '.join(worlds)}")
        sweep(out / a.world, worlds[a.world]["recipe"], a.runs, worlds[a.world]["table"])
        return 0
    names = a.worlds.split(",") if a.worlds else [n for n, w in worlds.items() if not w["frozen"]]
    unknown = [n for n in names if n not in worlds]
    if unknown:
        p.error(f"unknown world(s) {', '.join(unknown)}; worlds: {', '.join(worlds)}")
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if a.json else print
    from attune.bench.code import watched
    scores = []
    with watched() as code:   # the campaigns import the planner as they go: an edit meanwhile is said
        for name in names:
            if a.step == "campaigns":
                campaigns(out, worlds[name], a.budget, a.seeds, planners, say)
            if a.json:
                with contextlib.redirect_stdout(sys.stderr):
                    scores.append(report(out, worlds[name], a.budget))
            else:
                scores.append(report(out, worlds[name], a.budget))
    if a.json:
        print(json.dumps({"worlds": scores, "code": code}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
