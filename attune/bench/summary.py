"""Per recipe and planner variant: what the campaigns found per GPU-hour, scored on the ground truth.

Every campaign's gain is the noise-free ground-truth throughput of the layout it shipped (the
baseline when it shipped nothing) over that of the recipe's own layout on the same cluster (each
seed is its own cluster), so the noise that happened to hit the final measurement does not count.

  mean_gain, ci95   mean over seeds and its 95% t-interval
  best_gain         the best seed
  oracle_share      shipped throughput / the oracle's: the best layout of the lever space the gate's config
                    check passes (known defects and objective changes are not shippable), noise off
  gpu_hours_used    mean GPU-hours a campaign charged (baseline, search, confirmation)
  gpu_hours_to_95   GPU-hours after which the seed-mean gain of the incumbent first holds 95% of the
                    final mean gain (the incumbent is the layout the campaign would ship if it
                    stopped there, scored on the ground truth); 0 when that is the start, None when
                    the final mean gain is not positive
  search_gpu_hours_to_95
                    the same, counted from the end of the baseline replicates (every planner measures
                    the same baseline the same way; the search is what tells planners apart)
  median_oracle_share / median_shippable_share
                    median over seeds of shipped throughput / the oracle's, and / the best layout the
                    gate's config check passes without a numerics change (what a campaign can ship)
  gate_pass_rate    gate verdicts that passed, over all the campaigns' verdicts (a campaign whose
                    float8 candidate was refused gates its fallback too; None: nothing gated)
  payback_hours     hours of training on the recipe's cluster that repay the mean GPU-hours spent
                    at the mean gain (attune.campaign.payback); None without a positive gain
  headroom          the oracle's gain over the recipe (what there was to find; None without an oracle),
                    the mean over the campaigns' clusters; shippable_gain the same for the best layout
                    the gate passes without a numerics change
  false_gain_share  campaigns that shipped a change whose ground-truth gain is not positive, over all
                    (a measured "gain" that was noise: the case a well-tuned recipe tests)
Extras: search_gain (mean ground-truth gain of the layout the search settled on, before the gate:
what the planner found, whether or not it could ship), shipped_share, trials, max_budget_share.
"""

from __future__ import annotations

import math
from statistics import mean

import numpy as np
from scipy import stats

from attune.bench.request import oracle_key
from attune.campaign.payback import payback_hours

REACH = 0.95


def ci95(values: list[float]) -> list[float]:
    """95% t-interval of the mean (a point when there is one value)."""
    if not values:
        return [math.nan, math.nan]
    m = float(np.mean(values))
    if len(values) < 2:
        return [m, m]
    half = float(stats.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values)))
    return [m - half, m + half]


def step_value(trajectory: list[list[float]], hours: float) -> float:
    """The incumbent's value at `hours` of a [[gpu_hours, value], ...] step curve (0 before it starts)."""
    value = 0.0
    for h, v in trajectory:
        if h <= hours + 1e-12:
            value = v
        else:
            break
    return value


def mean_curve(trajectories: list[list[list[float]]], grid: list[float]) -> np.ndarray:
    """Seed-mean of step curves on a grid of GPU-hours: shape (len(grid),)."""
    return np.array([[step_value(t, h) for h in grid] for t in trajectories]).mean(axis=0)


def hours_to_reach(trajectories: list[list[list[float]]], final: float, share: float = REACH) -> float | None:
    """First GPU-hours at which the seed-mean gain curve holds `share` of the final mean gain."""
    if final <= 0 or not trajectories:
        return None
    grid = sorted({h for t in trajectories for h, _ in t} | {0.0})
    curve = mean_curve(trajectories, grid)
    for h, value in zip(grid, curve):
        if value >= share * final - 1e-12:
            return float(h)
    return float(grid[-1])


def after_baseline(cell: dict) -> list[list[float]]:
    """The cell's trajectory with GPU-hours counted from the end of its baseline replicates."""
    start = cell.get("baseline_gpu_hours") or 0.0
    return [[max(0.0, h - start), v] for h, v in cell["trajectory"] if h >= start - 1e-12]


def _mean_or_none(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def summarize(cells: list[dict], oracle: dict[str, dict]) -> list[dict]:
    """One row per (recipe, planner variant): recipes, then planners, in the order they first came.
    `oracle` is keyed by attune.bench.request.oracle_key: one oracle per recipe and cluster."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for cell in cells:
        groups.setdefault((cell["recipe"], cell["planner"]), []).append(cell)
    recipes = list(dict.fromkeys(c["recipe"] for c in cells))
    planners = list(dict.fromkeys(c["planner"] for c in cells))
    rows = []
    for recipe, planner in sorted(groups, key=lambda k: (recipes.index(k[0]), planners.index(k[1]))):
        group = groups[(recipe, planner)]
        ok = [c for c in group if not c.get("error")]
        row = {"recipe": recipe, "planner": planner, "seeds": len(group), "errors": len(group) - len(ok),
               "budget_gpu_hours": group[0]["budget_gpu_hours"], "simulated": True}
        if not ok:
            rows.append(row | {k: None for k in ("mean_gain", "best_gain", "ci95", "oracle_share", "gpu_hours_used",
                                                 "gpu_hours_to_95", "search_gpu_hours_to_95", "gate_pass_rate",
                                                 "payback_hours", "false_gain_share",
                                                 "max_budget_share")}
                        | {"error": group[0].get("error")})
            continue
        gains = [c["gain"] for c in ok]
        of = [oracle.get(oracle_key(recipe, c["cluster_seed"])) or {} for c in ok]
        best = [o.get("tokens_per_sec_per_gpu") for o in of]
        exact = [(o.get("exact") or {}).get("tokens_per_sec_per_gpu") for o in of]
        oracle_shares = [c["truth_shipped_tps"] / b for c, b in zip(ok, best) if b]
        shippable_shares = [c["truth_shipped_tps"] / e for c, e in zip(ok, exact) if e]
        gated = [c for c in ok if c["gate_passed"] is not None]
        runs = sum(c.get("gate_runs", 1) for c in gated)   # a refused float8 candidate and its fallback: 2
        used = mean(c["gpu_hours_used"] for c in ok)
        mean_gain = float(np.mean(gains))
        row |= {
            "mean_gain": mean_gain, "best_gain": max(gains), "ci95": ci95(gains),
            "oracle_share": float(np.mean(oracle_shares)) if oracle_shares else None,
            "median_oracle_share": float(np.median(oracle_shares)) if oracle_shares else None,
            "median_shippable_share": float(np.median(shippable_shares)) if shippable_shares else None,
            "gpu_hours_used": used,
            "baseline_gpu_hours": mean(c.get("baseline_gpu_hours") or 0.0 for c in ok),
            "gpu_hours_to_95": hours_to_reach([c["trajectory"] for c in ok], mean_gain),
            "search_gpu_hours_to_95": hours_to_reach([after_baseline(c) for c in ok], mean_gain),
            "gate_pass_rate": (sum(bool(c["gate_passed"]) for c in gated) / runs) if runs else None,
            "payback_hours": payback_hours(used, mean_gain, ok[0]["gpus"]),
            "max_budget_share": max(c["gpu_hours_used"] / c["budget_gpu_hours"] for c in ok),
            "shipped_share": sum(bool(c["shipped"]) for c in ok) / len(ok),
            "false_gain_share": sum(bool(c["shipped"]) and c["gain"] <= 0 for c in ok) / len(ok),
            "headroom": _mean_or_none([b / c["truth_baseline_tps"] - 1.0 if b and c.get("truth_baseline_tps") else None
                                       for c, b in zip(ok, best)]),
            "shippable_gain": _mean_or_none([e / c["truth_baseline_tps"] - 1.0 if e and c.get("truth_baseline_tps")
                                             else None for c, e in zip(ok, exact)]),
            "search_gain": float(np.mean([c.get("search_gain", c["gain"]) for c in ok])),
            "trials": mean(c["trials"] for c in ok),
        }
        rows.append(row)
    return rows


PUBLIC_KEYS = ("recipe", "planner", "mean_gain", "best_gain", "ci95", "oracle_share", "gpu_hours_used",
               "gpu_hours_to_95", "gate_pass_rate", "payback_hours")


def public_rows(rows: list[dict]) -> list[dict]:
    """The documented JSON fields first, then the extras (seeds, errors, budget share, ...)."""
    return [{k: row.get(k) for k in PUBLIC_KEYS} | {k: v for k, v in row.items() if k not in PUBLIC_KEYS}
            for row in rows]
