"""The benchmark's report: markdown tables (main, ablations, targets) and PNG plots.

Plot: per recipe, the ground-truth throughput of each planner's incumbent (as a share of the
oracle's) against GPU-hours spent, the line the seed mean and the band its 95% t-interval.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from attune.bench.request import ABLATION_PREFIX, oracle_key
from attune.bench.summary import ci95, step_value

SIM = "simulated: sim stack, scored on its noise-free ground truth"


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def main_table(rows: list[dict]) -> str:
    head = ("| recipe | planner | mean gain [95% CI] | best gain | oracle share | GPU-h used / budget "
            "| GPU-h to 95% (start / after baseline) | gate pass | payback h | search gain (pre-gate) | false gains |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        if r["planner"].startswith(ABLATION_PREFIX):
            continue
        if r.get("mean_gain") is None:
            lines.append(f"| {r['recipe']} | {r['planner']} | error: {str(r.get('error'))[:80]} |  |  |  |  |  |  |  |  |")
            continue
        lo, hi = r["ci95"]
        lines.append(
            f"| {r['recipe']} | {r['planner']} | {_pct(r['mean_gain'])} [{_pct(lo)}, {_pct(hi)}] "
            f"| {_pct(r['best_gain'])} | {_pct(r['oracle_share'], False)} "
            f"| {_num(r['gpu_hours_used'])} / {_num(r['budget_gpu_hours'], '{:g}')} | {_num(r['gpu_hours_to_95'])} / "
            f"{_num(r.get('search_gpu_hours_to_95'))} | {_pct(r['gate_pass_rate'], False)} | {_num(r['payback_hours'])} "
            f"| {_pct(r.get('search_gain'))} | {_pct(r.get('false_gain_share'), False)} |")
    return "\n".join(lines)


def ablation_table(rows: list[dict], full: str = "attune") -> str:
    """attune and each attune-no-RULE variant, with the gain each rule is worth."""
    variants = [r for r in rows if r["planner"] == full or r["planner"].startswith(ABLATION_PREFIX)]
    if not any(r["planner"].startswith(ABLATION_PREFIX) for r in variants):
        return ""
    lines = ["| recipe | variant | mean gain [95% CI] | Δ vs attune | oracle share | GPU-h to 95% | trials |",
             "|" + "---|" * 7]
    for r in variants:
        base = next((b for b in rows if b["recipe"] == r["recipe"] and b["planner"] == full), None)
        if r.get("mean_gain") is None:
            lines.append(f"| {r['recipe']} | {r['planner']} | error |  |  |  |  |")
            continue
        delta = (r["mean_gain"] - base["mean_gain"]) if base and base.get("mean_gain") is not None else None
        lo, hi = r["ci95"]
        lines.append(f"| {r['recipe']} | {r['planner']} | {_pct(r['mean_gain'])} [{_pct(lo)}, {_pct(hi)}] "
                     f"| {'—' if r['planner'] == full else _pct(delta)} | {_pct(r['oracle_share'], False)} "
                     f"| {_num(r['gpu_hours_to_95'])} | {_num(r.get('trials'))} |")
    return "\n".join(lines)


def targets_table(checks: list[dict]) -> str:
    if not checks:
        return ""
    lines = ["| recipe | target | holds | detail |", "|---|---|---|---|"]
    lines += [f"| {c['recipe']} | {c['target']} | {'yes' if c['holds'] else '**no**'} | {c['detail']} |" for c in checks]
    return "\n".join(lines)


def oracle_lines(oracle: dict[str, dict]) -> list[str]:
    """Per recipe: the oracle's gain over the recipe on each cluster (and the best layout the gate
    passes without a numerics change)."""
    by_recipe: dict[str, list[dict]] = {}
    for o in oracle.values():
        by_recipe.setdefault(o["recipe"], []).append(o)
    out = []
    for label, clusters in by_recipe.items():
        parts = []
        for o in sorted(clusters, key=lambda o: o.get("cluster_seed", 0)):
            base, best = o.get("baseline_tps"), o.get("tokens_per_sec_per_gpu")
            exact, anything = o.get("exact") or {}, o.get("any_layout") or {}
            if base and best:
                text = f"cluster {o.get('cluster_seed')}: {best / base - 1:+.1%}"
                extra = []
                if exact.get("tokens_per_sec_per_gpu"):
                    extra.append(f"{exact['tokens_per_sec_per_gpu'] / base - 1:+.1%} without a numerics change")
                if anything.get("tokens_per_sec_per_gpu", 0) > best * 1.001:
                    extra.append(f"{anything['tokens_per_sec_per_gpu'] / base - 1:+.1%} with layouts the config "
                                 f"check refuses")
                parts.append(text + (f" ({', '.join(extra)})" if extra else ""))
        if parts:
            out.append(f"- {label}: oracle (the best layout the gate's config check passes) over the recipe, "
                       f"{'; '.join(parts)}")
    return out


def markdown(rows: list[dict], checks: list[dict], meta: dict, oracle: dict[str, dict] | None = None) -> str:
    parts = [f"## Tuner benchmark ({SIM})", "",
             f"{meta.get('campaigns', 0)} campaigns ({meta.get('seeds')} seeds each, every seed on its own simulated "
             f"cluster of the {meta.get('world', 'realistic')} world, shared by all planners), budget per recipe as "
             f"shown, {meta.get('workers')} worker processes, {meta.get('seconds', 0):.0f} s wall"
             + (f"; code {meta['code']}" if meta.get("code") else "") + ".", "",
             main_table(rows)]
    if oracle:
        parts += ["", *oracle_lines(oracle)]
    ablations = ablation_table(rows)
    if ablations:
        parts += ["", "### Ablations: the attune planner with one search rule switched off", "", ablations]
    if checks:
        parts += ["", "### Targets", "", targets_table(checks)]
    return "\n".join(parts) + "\n"


PANEL_COLUMNS = 3   # a grid a README page can show at a readable size (one row of five was not)


def plot(cells: list[dict], oracle: dict[str, dict], path: Path, include_ablations: bool = False) -> Path:
    """One panel per recipe in a grid of PANEL_COLUMNS: incumbent ground-truth throughput / oracle vs
    GPU-hours, per planner; dashed: the oracle, dotted: the best layout the gate passes without a
    numerics change. One legend for all panels (a planner has the same colour in each), in the grid's
    spare cell or below it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = list(dict.fromkeys(c["recipe"] for c in cells))
    cols = min(PANEL_COLUMNS, len(recipes))
    rows = -(-len(recipes) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.7 * rows + 0.6), squeeze=False)
    planners = list(dict.fromkeys(c["planner"] for c in cells if include_ablations
                                  or not c["planner"].startswith(ABLATION_PREFIX)))
    colour = {planner: f"C{i % 10}" for i, planner in enumerate(planners)}
    legend: dict[str, Any] = {}

    def best_of(c: dict) -> float | None:
        return (oracle.get(oracle_key(c["recipe"], c["cluster_seed"])) or {}).get("tokens_per_sec_per_gpu")

    for ax, recipe in zip(axes.flat, recipes):
        mine = [c for c in cells if c["recipe"] == recipe and not c.get("error") and best_of(c)]
        if not mine:
            ax.set_title(f"{recipe}\n(no data)")
            continue
        budget = mine[0]["budget_gpu_hours"]
        grid = list(np.linspace(0.0, budget, 121))
        for planner in dict.fromkeys(c["planner"] for c in mine):
            if planner.startswith(ABLATION_PREFIX) and not include_ablations:
                continue
            curves = np.array([[step_value(c["tps_trajectory"], h) / best_of(c) for h in grid]
                               for c in mine if c["planner"] == planner])
            curves = np.where(curves > 0, curves, np.nan)   # before the first baseline: no incumbent
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                m = np.nanmean(curves, axis=0)
            bands = np.array([ci95([v for v in col if not np.isnan(v)]) if np.any(~np.isnan(col)) else [np.nan] * 2
                              for col in curves.T])
            legend[planner], = ax.step(grid, m, where="post", label=planner, lw=1.8, color=colour[planner])
            ax.fill_between(grid, bands[:, 0], bands[:, 1], step="post", alpha=0.18, color=colour[planner])
        legend["oracle"] = ax.axhline(1.0, color="k", lw=0.8, ls="--", label="oracle")
        shares = [((oracle.get(oracle_key(recipe, c["cluster_seed"])) or {}).get("exact") or {}).get("tokens_per_sec_per_gpu", 0.0)
                  / best_of(c) for c in mine if c["planner"] == mine[0]["planner"]]
        if any(shares):   # the best layout a campaign can ship today (no numerics change), mean over clusters
            legend["best shippable layout"] = ax.axhline(float(np.mean(shares)), color="0.4", lw=0.8, ls=":",
                                                         label="best shippable layout")
        ax.set_title(recipe, fontsize=10)
        ax.set_xlabel("GPU-hours spent", fontsize=9)
        ax.set_ylabel("incumbent / oracle throughput", fontsize=9)
        ax.set_xlim(0, budget)
        ax.grid(alpha=0.3)
    spare = list(axes.flat)[len(recipes):]
    for ax in spare:
        ax.axis("off")
    if spare:   # the legend fills the grid's first empty cell
        spare[0].legend(legend.values(), legend.keys(), loc="center", fontsize=9, frameon=False)
    else:
        fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=min(4, len(legend)), fontsize=9,
                   frameon=False)
    fig.suptitle(f"Best-so-far throughput vs GPU-hours ({SIM}; y: ground truth)", fontsize=10)
    fig.tight_layout(rect=(0, 0 if spare else 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
