"""The budget curve: every planner at 1/8, 1/4, 1/2 and 1x the convention budget (issue 27).

    .venv/bin/python benchmarks/bench_budget_curve.py --plot docs/img/bench-budget-curve.png   # the docs' curve:
                                                                         # 5 recipes x 7 planners x 5 seeds x 4 budgets
    .venv/bin/python benchmarks/bench_budget_curve.py --seeds 2 --shares 0.25,1 --planners attune,estimator-topk

The recipes and planners of benchmarks/bench_tuners.py (the four MoE recipes at 64-256 GPUs and the
well-tuned DeepSeek-V3-16B), the realistic world, each seed on its own sibling cluster; the budget
is a share of the convention (40 GPU-hours per 64 GPUs: 5, 10, 20, 40 per 64 GPUs). Runs `attune
bench --budget-share F` once per share, all sharing one gate cache (verdicts are deterministic in
their inputs), and prints, per share, recipe and planner: the mean ground-truth gain, its share of
the shippable gain, GPU-hours used, and false gains (a shipped change not faster on the truth).

The shippable gain of a recipe on a cluster is what the gate can be shown to ship there: the larger
of the best layout the config check passes without a numerics change (no convergence check can
refuse it) and the best gain any campaign of the curve shipped on that cluster (a shipped layout
passed the whole gate). It is a lower bound of what the gate would pass (a float8 layout no
campaign gated may pass too), so shares of it are upper bounds; the share of the oracle's gain (the
best layout the config check passes, float8 included, whether or not the convergence check would)
is printed beside it. Targets (printed, never asserted): attune at 1/4 ships >= 80% of the
shippable gain, at 1/2 >= 90%, at every budget a mean gain >= every other planner's; no false gain
on the well-tuned recipe at any budget. Every figure is simulated.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench_tuners import PLANNERS, RECIPES, REPO, bench

SHARES = (0.125, 0.25, 0.5, 1.0)
TARGETS = {0.25: 0.80, 0.5: 0.90}


def _frac(share: float) -> str:
    return {0.125: "1/8", 0.25: "1/4", 0.5: "1/2", 1.0: "1x"}.get(share, f"{share:g}x")


def run(shares: list[float], args: list[str], out: Path) -> dict[float, dict]:
    """`attune bench` at each share: its results.json and cells.json (and the seconds it took)."""
    runs = {}
    for share in shares:
        folder = out / f"share-{share:g}"
        payload, seconds = bench([*args, "--budget-share", f"{share:g}"], folder)
        cells = json.loads((folder / "cells.json").read_text())
        runs[share] = {"payload": payload, "cells": cells, "seconds": seconds}
        same_code(runs)
        print(f"[budget curve] {_frac(share)}: {len(cells)} campaigns in {seconds:.0f} s", file=sys.stderr, flush=True)
    return runs


def same_code(runs: dict[float, dict]) -> None:
    """Stop the curve once a share ran other code than the shares before it, or code that changed while it
    ran (attune.bench.code): its cells would mix code versions, and a rerun of one could not reproduce it."""
    codes = {share: r["payload"].get("code") or {} for share, r in runs.items()}
    first = next(iter(codes.values())).get("digest")
    for share, code in codes.items():
        if code.get("changed_during_run") or code.get("digest") != first:
            sys.exit(f"[budget curve] the code changed during the curve (share {_frac(share)}: {code.get('digest')} -> "
                     f"{code.get('after')}, the first share's {first}): its shares ran different code; rerun it on "
                     f"a checkout nobody edits meanwhile")


def shippable(runs: dict[float, dict]) -> dict[tuple[str, int], float]:
    """Per (recipe, cluster_seed): the gain the gate can be shown to ship (see the module's note)."""
    best: dict[tuple[str, int], float] = {}
    for r in runs.values():
        oracle = r["payload"]["oracle"]
        for c in r["cells"]:
            if c.get("error"):
                continue
            key = (c["recipe"], c["cluster_seed"])
            o = oracle.get(f"{c['recipe']}#{c['cluster_seed']}") or {}
            exact = (o.get("exact") or {}).get("tokens_per_sec_per_gpu")
            floor = exact / c["truth_baseline_tps"] - 1.0 if exact and c.get("truth_baseline_tps") else 0.0
            shipped = c["gain"] if c["shipped"] and c["gain"] > 0 else 0.0
            best[key] = max(best.get(key, 0.0), floor, shipped)
    return best


def oracle_gain(r: dict, c: dict) -> float | None:
    o = r["payload"]["oracle"].get(f"{c['recipe']}#{c['cluster_seed']}") or {}
    b = o.get("tokens_per_sec_per_gpu")
    return b / c["truth_baseline_tps"] - 1.0 if b and c.get("truth_baseline_tps") else None


def rows(runs: dict[float, dict]) -> list[dict]:
    """One row per (share, recipe, planner)."""
    ship = shippable(runs)
    out = []
    for share, r in runs.items():
        groups: dict[tuple[str, str], list[dict]] = {}
        for c in r["cells"]:
            if not c.get("error"):
                groups.setdefault((c["recipe"], c["planner"]), []).append(c)
        for (recipe, planner), cells in groups.items():
            n = len(cells)
            gain = sum(c["gain"] for c in cells) / n
            can = sum(ship[(recipe, c["cluster_seed"])] for c in cells) / n
            oracle = [g for g in (oracle_gain(r, c) for c in cells) if g is not None]
            out.append({"share": share, "recipe": recipe, "planner": planner, "seeds": n, "gain": gain,
                        "shippable": can, "of_shippable": gain / can if can > 0 else None,
                        "of_oracle_gain": gain / (sum(oracle) / len(oracle)) if oracle and sum(oracle) > 0 else None,
                        "gpu_hours": sum(c["gpu_hours_used"] for c in cells) / n,
                        "budget": cells[0]["budget_gpu_hours"],
                        "over_budget": sum(c["gpu_hours_used"] > c["budget_gpu_hours"] + 1e-9 for c in cells),
                        "shipped": sum(bool(c["shipped"]) for c in cells),
                        "false_gains": sum(bool(c["shipped"]) and c["gain"] <= 0 for c in cells),
                        "tuned": "-tuned@" in recipe})
    return out


def _pct(x: float | None, signed: bool = False) -> str:
    return "—" if x is None else (f"{x:+.1%}" if signed else f"{x:.0%}")


def planners_of(table: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["planner"] for r in table))


def summary_table(table: list[dict]) -> str:
    """Per share and planner, over the recipes with something to find: the mean share of the shippable
    gain (each recipe's mean gain over its mean shippable gain, averaged over recipes), the mean gain,
    GPU-hours used as a share of the budget; false gains over every campaign (tuned recipe apart)."""
    planners = planners_of(table)
    lines = ["| budget (per 64 GPUs) | " + " | ".join(planners) + " |", "|---|" + "---|" * len(planners)]
    for share in sorted({r["share"] for r in table}):
        cells = []
        for p in planners:
            rs = [r for r in table if r["share"] == share and r["planner"] == p and not r["tuned"]]
            tuned = [r for r in table if r["share"] == share and r["planner"] == p and r["tuned"]]
            shares = [r["of_shippable"] for r in rs if r["of_shippable"] is not None]
            used = sum(r["gpu_hours"] / r["budget"] for r in rs + tuned) / max(1, len(rs + tuned))
            fg = sum(r["false_gains"] for r in rs + tuned)
            cells.append(f"{_pct(sum(shares) / len(shares) if shares else None)} · "
                         f"{_pct(sum(r['gain'] for r in rs) / max(1, len(rs)), True)} · {used:.0%} · {fg}")
        lines.append(f"| {_frac(share)} ({40 * share:g} GPU-h) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(table: list[dict], share: float) -> str:
    planners = planners_of(table)
    recipes = list(dict.fromkeys(r["recipe"] for r in table))
    lines = ["| recipe (budget GPU-h, shippable gain) | " + " | ".join(planners) + " |",
             "|---|" + "---|" * len(planners)]
    for recipe in recipes:
        rs = {r["planner"]: r for r in table if r["share"] == share and r["recipe"] == recipe}
        if not rs:
            continue
        first = next(iter(rs.values()))
        cells = []
        for p in planners:
            r = rs.get(p)
            cells.append("—" if r is None else
                         f"{_pct(r['gain'], True)} · {_pct(r['of_shippable'])} · {r['gpu_hours']:.0f}"
                         + (f" · **FG {r['false_gains']}**" if r["false_gains"] else ""))
        lines.append(f"| {recipe} ({first['budget']:g}, {_pct(first['shippable'], True)}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(table: list[dict]) -> list[str]:
    out = []
    for share in sorted({r["share"] for r in table}):
        mine = [r for r in table if r["share"] == share and r["planner"] == "attune" and not r["tuned"]]
        shares = [r["of_shippable"] for r in mine if r["of_shippable"] is not None]
        mean_share = sum(shares) / len(shares) if shares else None
        if share in TARGETS and mean_share is not None:
            out.append(f"{_frac(share)}: attune ships {mean_share:.1%} of the shippable gain (mean over recipes; "
                       f"target >= {TARGETS[share]:.0%}): {'holds' if mean_share >= TARGETS[share] else 'MISSES'}")
        for r in mine:
            rivals = [o for o in table if o["share"] == share and o["recipe"] == r["recipe"] and o["planner"] != "attune"]
            beaten_by = [f"{o['planner']} ({o['gain']:+.1%})" for o in rivals if o["gain"] > r["gain"] + 1e-9]
            if beaten_by:
                out.append(f"{_frac(share)}: {r['recipe']}: attune {r['gain']:+.1%} is below {', '.join(beaten_by)}")
        fg = [r for r in table if r["share"] == share and r["tuned"] and r["false_gains"]]
        over = [r for r in table if r["share"] == share and r["over_budget"]]
        out.append(f"{_frac(share)}: false gains on the well-tuned recipe: "
                   + (", ".join(f"{r['planner']} {r['false_gains']}" for r in fg) if fg else "none")
                   + ("; OVER BUDGET: " + ", ".join(f"{r['planner']}@{r['recipe']}" for r in over) if over else ""))
    return out


def plot(table: list[dict], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    shares = sorted({r["share"] for r in table})
    for p in planners_of(table):
        ys = []
        for share in shares:
            rs = [r["of_shippable"] for r in table if r["share"] == share and r["planner"] == p and not r["tuned"]
                  and r["of_shippable"] is not None]
            ys.append(100 * sum(rs) / len(rs) if rs else float("nan"))
        ax.plot([40 * s for s in shares], ys, marker="o", label=p, linewidth=2.5 if p == "attune" else 1.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks([40 * s for s in shares], [f"{40 * s:g}\n({_frac(s)})" for s in shares])
    ax.set_xlabel("budget, GPU-hours per 64 GPUs (share of the convention)")
    ax.set_ylabel("mean gain, % of the shippable gain")
    recipes = len({r["recipe"] for r in table if not r["tuned"]})
    seeds = max(r["seeds"] for r in table)
    ax.set_title(f"Gain against budget: {recipes} recipes x {seeds} seeds, realistic world (simulated)")
    ax.axhline(80, color="grey", linestyle=":", linewidth=0.8)
    ax.axhline(90, color="grey", linestyle=":", linewidth=0.8)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", nargs="+", default=RECIPES)
    p.add_argument("--planners", default=PLANNERS)
    p.add_argument("--shares", default=",".join(f"{s:g}" for s in SHARES), help="budget shares of the convention")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--world", default="realistic")
    p.add_argument("--out", default=str(REPO / ".attune" / "bench-budget-curve"))
    p.add_argument("--plot", help="where the plot goes (default: budget-curve.png under --out; the docs' figure is "
                                  "docs/img/bench-budget-curve.png, from a run of every planner and share)")
    p.add_argument("--workers", type=int)
    p.add_argument("--reuse", action="store_true", help="tabulate the runs already under --out, run nothing")
    a = p.parse_args()
    out = Path(a.out).resolve()
    shares = [float(s) for s in a.shares.split(",")]
    started = time.monotonic()
    if a.reuse:
        runs = {}
        for share in shares:
            folder = out / f"share-{share:g}"
            runs[share] = {"payload": json.loads((folder / "results.json").read_text()),
                           "cells": json.loads((folder / "cells.json").read_text()), "seconds": 0.0}
    else:
        common = ["--recipes", *a.recipes, "--planners", a.planners, "--seeds", str(a.seeds), "--world", a.world,
                  "--gate-cache", str(out / "gate-cache"), "--quiet"] + (["--workers", str(a.workers)] if a.workers else [])
        runs = run(shares, common, out)
    table = rows(runs)
    (out / "budget-curve.json").write_text(json.dumps(table, indent=1))
    print(f"## The budget curve (simulated; {a.world} world, {a.seeds} seeds, "
          f"{sum(r['seconds'] for r in runs.values()):.0f} s of benchmarks)\n")
    print("Per budget and planner, over the four MoE recipes: **mean share of the shippable gain · mean gain · "
          "GPU-hours used of the budget · false gains** (all five recipes)\n")
    print(summary_table(table))
    for share in shares:
        print(f"\n### {_frac(share)} of the convention budget: mean gain · share of the shippable gain · GPU-hours used\n")
        print(detail_table(table, share))
    print("\n### Targets\n")
    for line in targets(table):
        print(f"- {line}")
    print(f"\nplot: {plot(table, Path(a.plot) if a.plot else out / 'budget-curve.png')}; rows: {out / 'budget-curve.json'}; {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
