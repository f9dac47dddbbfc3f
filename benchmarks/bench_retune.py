"""Re-tunes: after a change, a campaign warm-started from the earlier one against a fresh campaign.

    .venv/bin/python benchmarks/bench_retune.py --json                     # every scenario
    .venv/bin/python benchmarks/bench_retune.py --scenarios cpu-memory --seeds 3

For each scenario and seed: the first campaign tunes the recipe before the change (at the full
budget); after the change, a fresh campaign (the full budget), a campaign warm-started from the
first (`--warm-start`, a third of the budget) and a fresh one at that third tune the same recipe. Each shipped layout is scored on
the changed world's truth: measured scenarios on the CPU benchmark's real sweeps (benchmarks/cpu/,
replayed by the `measured` stack), simulated ones on the simulated cluster's ground truth
(*simulated*). A layout's gain is over the recipe's own layout in the changed world. Every campaign
has a recipe store of its own; the three after the change start from a copy of the first
campaign's lessons ledger (what a team's store would hold), none from another seed's or from one
another's.

    cpu-memory     seq128 -> seq128-tight: the same sweep, the memory per process cut so that it binds
    cpu-workload   seq128 -> seq512: 4x the sequence, a quarter of the batch (another real sweep)
    sim-h200       DeepSeek-V3 16B on 64 H100 -> 64 H200 (simulated, realistic world)
    sim-compile    the same recipe and cluster after a stack upgrade that shifts one cost: the compiler
                   keeps half of compile's gain (world realistic-compile-regression; the oracle stays,
                   every compiled layout slows; added 2026-12-08, after the warm-start rule was chosen)
    sim-cluster    the same recipe on another simulated H100 cluster of the realistic world (its
                   departures from the estimator differ: a change that can reorder the layouts)
    sim-h200-qwen  Qwen3-30B-A3B on 128 H100 -> 128 H200 (simulated; added after the warm-start rule
                   was chosen on the four above, as a check it was not fitted to them)

`--json` prints {"scenarios": [{"name", "measured", "old_gain", "fresh_gain", "fresh_gpu_hours",
"warm_gain", "warm_gpu_hours", "fresh_third_gain", "fresh_third_gpu_hours", "warm_below_old",
"ranks_held"}]} (means over seeds; warm_below_old counts the seeds whose warm re-tune shipped a
layout slower than the first campaign's, re-measured in the changed world). About 6 minutes for
the two CPU scenarios at 5 seeds, 4 minutes per seed of a simulated one, on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

OUT = REPO / ".attune" / "bench-retune"
CPU_BUDGET = 0.25      # process-hours, as the CPU benchmark
SIM_BUDGET = 40.0      # GPU-hours per 64 GPUs, the convention budget
WARM_SHARE = 1 / 3     # the warm re-tune's budget: the target is the fresh gain in a third of its GPU-hours
SIM_RECIPE = REPO / "benchmarks" / "recipes" / "deepseek_v3_16b_h100x64.toml"


def _cpu_world(name: str) -> dict:
    from bench_cpu_hardware import load_worlds
    return load_worlds()[name]


SCENARIOS = {
    "cpu-memory": {"measured": True, "before": "seq128", "after": "seq128-tight"},
    "cpu-workload": {"measured": True, "before": "seq128", "after": "seq512"},
    "sim-h200": {"measured": False, "before": {"cluster": None, "cluster_seed": 1},
                 "after": {"cluster": "h200:64", "cluster_seed": 1}},
    "sim-compile": {"measured": False, "before": {"cluster": None, "cluster_seed": 1},
                    "after": {"cluster": None, "cluster_seed": 1, "world": "realistic-compile-regression"}},
    "sim-cluster": {"measured": False, "before": {"cluster": None, "cluster_seed": 1},
                    "after": {"cluster": None, "cluster_seed": 2}},
    # run after the rule was chosen on the four above: a check it was not fitted to
    "sim-h200-qwen": {"measured": False, "before": {"recipe": "qwen3_30b_a3b_h100x128.toml", "cluster": None,
                                                    "cluster_seed": 1},
                      "after": {"recipe": "qwen3_30b_a3b_h100x128.toml", "cluster": "h200:128", "cluster_seed": 1}},
}


class World:
    """Where a campaign runs and how its shipped layout is scored."""

    def __init__(self, spec, measured: bool):
        from attune.campaign.inputs import load_campaign_recipe
        self.measured = measured
        if measured:
            self.world = _cpu_world(spec)
            self.recipe_path, self.cluster = str(self.world["recipe"]), None
            self.options = {"table": str(self.world["table"])} | (
                {"run_sd": self.world["run_sd"]} if self.world["run_sd"] else {})
            self.stack, self.budget = "measured", CPU_BUDGET
            from attune.stacks.measured import MeasuredTable
            self.table = MeasuredTable(self.world["table"])
        else:
            recipe = SIM_RECIPE.parent / spec["recipe"] if "recipe" in spec else SIM_RECIPE
            self.recipe_path, self.cluster = str(recipe), spec["cluster"]
            self.options = {"cluster_seed": spec["cluster_seed"], "world": spec.get("world", "realistic")}
            self.stack = "sim"
        self.recipe = load_campaign_recipe(self.recipe_path, self.cluster)
        if not measured:
            self.budget = SIM_BUDGET * self.recipe.cluster.gpus / 64

    def tps(self, levers: dict) -> float:
        """The truth of a layout here (0 where it does not run or does not fit)."""
        if self.measured:
            from attune.errors import InputError
            try:
                fits = self.table.fits(levers, self.recipe.cluster.memory_gib)
            except InputError:   # not a layout of this world's sweep (another batch): it cannot run here
                return 0.0
            return (self.table.layout_tps(levers) or 0.0) if fits else 0.0
        from attune.bench.truth import truth_tps
        try:
            return truth_tps(self.recipe, levers, self.options["cluster_seed"], self.options["world"])
        except Exception:   # noqa: BLE001 - a layout this cluster cannot take runs at 0
            return 0.0

    def campaign(self, seed: int, budget: float, warm: str | None = None, ledger: str | None = None) -> dict:
        """One campaign with a recipe store of its own: it learns lessons from the ledger of the store
        `ledger` (a copy: the first campaign's, as a team's store would hold it after the change),
        never from a campaign of another seed or from another campaign after the change."""
        from attune.campaign.context import CampaignSettings
        from flows.campaign import tune_campaign
        settings = CampaignSettings(stack=self.stack, planner="attune", seed=seed, budget_gpu_hours=budget,
                                    stack_options=self.options, warm_start=warm)
        store = Path(tempfile.mkdtemp(prefix="store-", dir=os.environ["ATTUNE_HOME"]))
        if ledger is not None and (Path(ledger) / "lessons").is_dir():
            shutil.copytree(Path(ledger) / "lessons", store / "lessons")
        result = tune_campaign(self.recipe_path, settings, cluster=self.cluster, quiet=True, store=str(store))
        result = result if isinstance(result, dict) else result.result()
        return result | {"store": str(store)}


def run(name: str, seeds: int, out: Path, say=print) -> list[dict]:
    spec = SCENARIOS[name]
    before, after = World(spec["before"], spec["measured"]), World(spec["after"], spec["measured"])
    os.environ["ATTUNE_HOME"] = str(out / name / "home")
    Path(os.environ["ATTUNE_HOME"]).mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in range(seeds):
        started = time.monotonic()
        first = before.campaign(seed, before.budget)
        old, ledger = first["best"]["levers"], first["store"]
        fresh = after.campaign(seed, after.budget, ledger=ledger)
        warm = after.campaign(seed, after.budget * WARM_SHARE, warm=first["campaign_dir"], ledger=ledger)
        # a fresh campaign at the warm one's budget and seed (the same replay noise): what the warm start adds
        small = after.campaign(seed, after.budget * WARM_SHARE, ledger=ledger)
        base = after.tps(after.recipe.layout().levers())
        row = {"scenario": name, "seed": seed,
               "old_gain": before.tps(old) / before.tps(before.recipe.layout().levers()) - 1,
               "old_here": after.tps(old) / base - 1,
               "fresh_gain": after.tps(fresh["best"]["levers"]) / base - 1, "fresh_gpu_hours": fresh["gpu_hours_used"],
               "warm_gain": after.tps(warm["best"]["levers"]) / base - 1, "warm_gpu_hours": warm["gpu_hours_used"],
               "fresh_third_gain": after.tps(small["best"]["levers"]) / base - 1,
               "fresh_third_gpu_hours": small["gpu_hours_used"],
               "ranks_held": bool(((warm.get("warm_start") or {}).get("map") or {}).get("holds")),
               "warm_why": ((warm.get("warm_start") or {}).get("map") or {}).get("why", ""),
               "seconds": time.monotonic() - started}
        row["warm_below_old"] = row["warm_gain"] < row["old_here"] - 1e-9
        rows.append(row)
        with (out / "rows.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        say(f"{name} seed {seed}: old {row['old_gain']:+.1%} (here {row['old_here']:+.1%}); fresh "
            f"{row['fresh_gain']:+.1%} for {row['fresh_gpu_hours']:.3g}; warm {row['warm_gain']:+.1%} for "
            f"{row['warm_gpu_hours']:.3g} ({row['warm_why'] or 'no map'}); fresh at the warm budget "
            f"{row['fresh_third_gain']:+.1%}, {row['seconds']:.0f} s")
    return rows


def summarize(name: str, rows: list[dict]) -> dict:
    mean = lambda key: statistics.mean(r[key] for r in rows)   # noqa: E731
    return {"name": name, "measured": SCENARIOS[name]["measured"], "seeds": len(rows),
            "old_gain": mean("old_gain"), "old_here": mean("old_here"),
            "fresh_gain": mean("fresh_gain"), "fresh_gpu_hours": mean("fresh_gpu_hours"),
            "warm_gain": mean("warm_gain"), "warm_gpu_hours": mean("warm_gpu_hours"),
            "fresh_third_gain": mean("fresh_third_gain"), "fresh_third_gpu_hours": mean("fresh_third_gpu_hours"),
            "warm_below_old": sum(r["warm_below_old"] for r in rows),
            "ranks_held": sum(r["ranks_held"] for r in rows)}


def table(results: list[dict]) -> str:
    lines = ["| scenario | seeds | old gain (before · after the change) | fresh: gain · GPU-h | warm: gain · GPU-h "
             "| warm / fresh gain · GPU-h | fresh at the warm budget | warm below old | ranks held |", "|---" * 9 + "|"]
    for s in results:
        share = s["warm_gain"] / s["fresh_gain"] if s["fresh_gain"] > 0 else float("nan")
        label = s["name"] + ("" if s["measured"] else " *(simulated)*")
        lines.append(f"| {label} | {s['seeds']} | {s['old_gain']:+.1%} · {s['old_here']:+.1%} | "
                     f"{s['fresh_gain']:+.1%} · {s['fresh_gpu_hours']:.3g} | {s['warm_gain']:+.1%} · "
                     f"{s['warm_gpu_hours']:.3g} | {share:.0%} · {s['warm_gpu_hours'] / s['fresh_gpu_hours']:.0%} | "
                     f"{s['fresh_third_gain']:+.1%} | "
                     f"{s['warm_below_old']} | {s['ranks_held']}/{s['seeds']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of: " + ", ".join(SCENARIOS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or args.seeds < 1:
        print(f"--scenarios: unknown {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}" if unknown
              else "--seeds: must be >= 1", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    say = (lambda text: print(text, file=sys.stderr, flush=True))
    from attune.bench.code import watched
    with watched() as code:   # an edit while the campaigns run is said, and recorded
        results = [summarize(name, run(name, args.seeds, args.out, say)) for name in names]
    (args.out / "results.json").write_text(json.dumps({"scenarios": results, "code": code}, indent=1))
    print(json.dumps({"scenarios": results, "code": code}, indent=1) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
