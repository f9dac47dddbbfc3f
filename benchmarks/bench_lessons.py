"""The lessons' worth, learned from campaigns of *other* recipes than the one scored (issue 37, part 4).

    .venv/bin/python benchmarks/bench_lessons.py --json                   # the CPU worlds, 5 seeds
    .venv/bin/python benchmarks/bench_lessons.py --sim --seeds 2 --json   # the simulated recipes too

Three variants of the attune planner per scored recipe and seed:

    catalog      the lessons catalog alone (an empty ledger: how every benchmark runs)
    learned      the catalog updated by a lessons ledger written by the `catalog` campaigns of the
                 recipes held apart from the scored one (attune.lessons.posterior)
    no-lessons   the lessons rule switched off

CPU (*measured*): the CPU benchmark's worlds, replayed on their real sweeps; worlds that share a
sweep (seq128 and seq128-tight) are held out together, so a world never learns from its own
sweep. Simulated (`--sim`, *simulated*): the tuner benchmark's MoE recipes on sibling clusters of
the realistic world, held out by model (DeepSeek's two recipes together). Scored as their
benchmarks score: share of the measured oracle (CPU) or gain on the simulated truth.

`--json` prints {"worlds": [{"name", "measured", "held_out_from", "ledger_campaigns",
"variants": {VARIANT: {"share_mean", "share_worst", "gain_mean", "used_mean", "lesson_trials"}}}]}
(`share_*` on the CPU only; `lesson_trials`: search trials whose rationale cites a lesson, mean per
campaign, and of those citing measured evidence). About 12 minutes on the CPU worlds at 5 seeds;
a simulated recipe takes about a minute a campaign.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

OUT = REPO / ".attune" / "bench-lessons"
CPU_BUDGET = 0.25
SIM_RECIPES = {"deepseek_v3_16b_h100x64.toml": "deepseek", "deepseek_v3_16b_b200x256.toml": "deepseek",
               "gpt_oss_120b_h100x128.toml": "gpt-oss", "qwen3_30b_a3b_h100x128.toml": "qwen3"}
VARIANTS = ("catalog", "learned", "no-lessons")


def merge_ledgers(stores: list[Path], into: Path) -> int:
    """One store folder holding the ledger objects of every store in `stores`; the campaigns merged."""
    from attune.lessons.ledger import PREFIX
    shutil.rmtree(into, ignore_errors=True)
    (into / PREFIX).mkdir(parents=True)
    for store in stores:
        for path in sorted((store / PREFIX).glob("*.json")):
            shutil.copy(path, into / PREFIX / path.name)
    return len(list((into / PREFIX).glob("*.json")))


def lesson_trials(campaign_dir: Path) -> tuple[int, int]:
    """Search trials whose rationale cites a lesson, and of those, one with measured evidence."""
    state = json.loads((campaign_dir / "state.json").read_text())
    cited = [t["rationale"] for t in state["trials"] if t["role"] == "trial" and t.get("lesson_id")]
    return len(cited), sum(" campaign" in r and "no campaign" not in r for r in cited)


# --- the CPU worlds (measured) ---------------------------------------------------------------------

def cpu(out: Path, seeds: int, say=print) -> list[dict]:
    from bench_cpu_hardware import campaigns, load_worlds, score
    from attune.bench.request import parse_planners
    worlds = [w for w in load_worlds().values()]
    groups = {w["name"]: str(w["table"]) for w in worlds}
    for w in worlds:   # the catalog variant: its campaigns' ledgers are what the other worlds learn from
        campaigns(out / "catalog", w, CPU_BUDGET, seeds, parse_planners("attune"), say=say)
    results = []
    for w in worlds:
        others = [o["name"] for o in worlds if groups[o["name"]] != groups[w["name"]]]
        ledger = out / "ledgers" / w["name"]
        n = merge_ledgers([s for o in others for s in sorted((out / "catalog" / o / "stores").iterdir())], ledger)
        campaigns(out / "learned", w, CPU_BUDGET, seeds, parse_planners("attune"), say=say, ledger=ledger)
        campaigns(out / "no-lessons", w, CPU_BUDGET, seeds, parse_planners("attune-no-lessons"), say=say)
        variants = {}
        for variant in VARIANTS:
            rows = _rows(out / variant / w["name"] / f"campaigns-{CPU_BUDGET:g}.jsonl")
            scored = next(iter(score(w, rows)["planners"].values()))
            cites = [lesson_trials(Path(r["campaign_dir"])) for r in rows]
            variants[variant] = {k: scored[k] for k in ("share_mean", "share_worst", "gain_mean", "used_mean")} | {
                "lesson_trials": statistics.mean(c for c, _ in cites),
                "lesson_trials_with_evidence": statistics.mean(e for _, e in cites)}
        results.append({"name": w["name"], "measured": True, "frozen": w["frozen"], "held_out_from": others,
                        "ledger_campaigns": n, "variants": variants})
    return results


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- the simulated recipes -------------------------------------------------------------------------

def sim(out: Path, seeds: int, say=print) -> list[dict]:
    from bench_retune import SIM_BUDGET, World
    from attune.campaign.context import CampaignSettings
    from flows.campaign import tune_campaign

    def run(recipe: str, variant: str, seed: int, ledger: Path | None) -> dict:
        world = World({"recipe": recipe, "cluster": None, "cluster_seed": seed + 1}, measured=False)
        store = out / variant / recipe.removesuffix(".toml") / f"store-{seed}"
        shutil.rmtree(store, ignore_errors=True)
        if ledger is not None:
            shutil.copytree(ledger, store)
        os.environ["ATTUNE_HOME"] = str(out / variant / "home")
        settings = CampaignSettings(stack="sim", planner="attune", seed=seed, budget_gpu_hours=world.budget,
                                    stack_options=world.options,
                                    disabled_rules=["lessons"] if variant == "no-lessons" else [])
        result = tune_campaign(world.recipe_path, settings, quiet=True, store=str(store))
        result = result if isinstance(result, dict) else result.result()
        base = world.tps(world.recipe.layout().levers())
        row = {"gain": world.tps(result["best"]["levers"]) / base - 1, "used": result["gpu_hours_used"] / world.budget,
               "cites": lesson_trials(Path(result["campaign_dir"]))}
        say(f"{recipe} {variant} seed {seed}: {row['gain']:+.1%} (simulated), {row['used']:.0%} of the budget, "
            f"{row['cites'][0]} trial(s) citing a lesson")
        return row

    assert SIM_BUDGET > 0
    catalog = {(r, s): run(r, "catalog", s, None) for r in SIM_RECIPES for s in range(seeds)}
    results = []
    for recipe, model in SIM_RECIPES.items():
        others = [r for r, m in SIM_RECIPES.items() if m != model]
        ledger = out / "ledgers" / recipe.removesuffix(".toml")
        n = merge_ledgers([out / "catalog" / o.removesuffix(".toml") / f"store-{s}" for o in others
                           for s in range(seeds)], ledger)
        rows = {"catalog": [catalog[(recipe, s)] for s in range(seeds)],
                "learned": [run(recipe, "learned", s, ledger) for s in range(seeds)],
                "no-lessons": [run(recipe, "no-lessons", s, None) for s in range(seeds)]}
        results.append({"name": recipe.removesuffix(".toml"), "measured": False, "held_out_from": others,
                        "ledger_campaigns": n, "variants": {v: {
                            "gain_mean": statistics.mean(r["gain"] for r in rs),
                            "used_mean": statistics.mean(r["used"] for r in rs),
                            "lesson_trials": statistics.mean(r["cites"][0] for r in rs),
                            "lesson_trials_with_evidence": statistics.mean(r["cites"][1] for r in rs)}
                            for v, rs in rows.items()}})
    return results


def table(results: list[dict]) -> str:
    lines = ["| recipe | learned from | " + " | ".join(VARIANTS) + " |", "|---" * (2 + len(VARIANTS)) + "|"]
    for w in results:
        cells = []
        for v in VARIANTS:
            s = w["variants"][v]
            share = f"{s['share_mean']:.1%}, {s['share_worst']:.1%} · " if "share_mean" in s else ""
            cells.append(f"{share}{s['gain_mean']:+.1%} ({s['lesson_trials']:.1f} lesson trials"
                         + (f", {s['lesson_trials_with_evidence']:.1f} with evidence" if v == "learned" else "") + ")")
        label = w["name"] + ("" if w["measured"] else " *(simulated)*")
        lines.append(f"| {label} | {w['ledger_campaigns']} campaigns of {', '.join(w['held_out_from'])} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--sim", action="store_true", help="the simulated recipes too (about a minute a campaign)")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU worlds")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds: at least 1")
    from attune.cli.common import quiet_local_prefect
    quiet_local_prefect()   # the ephemeral API's first start on a fresh machine takes longer than Prefect waits
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if args.json else print
    from attune.bench.code import watched
    with watched() as code:   # an edit while the campaigns run is said, and recorded
        results = ([] if args.no_cpu else cpu(args.out, args.seeds, say)) + (sim(args.out, args.seeds, say) if args.sim else [])
    (args.out / "results.json").parent.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"worlds": results, "code": code}, indent=1))
    if args.json:
        print(json.dumps({"worlds": results, "code": code}))
    else:
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
