"""The issue's measured targets, checked per recipe on the summary rows (reported, never enforced).

  gain-vs-random / gain-vs-bayes   attune's mean gain >= 2x theirs (and positive)
  gain-vs-estimator-topk           attune's mean gain >= estimator-topk's
  speed                            attune reaches 95% of its final gain in <= half the GPU-hours the
                                   best other planner (highest mean gain, ablations excluded) needs
  budget                           no campaign of any planner charged more than its budget
"""

from __future__ import annotations

from attune.bench.request import ABLATION_PREFIX

FACTOR = {"random": 2.0, "bayes": 2.0, "estimator-topk": 1.0}


def check_targets(rows: list[dict], planner: str = "attune") -> list[dict]:
    out = []
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        mine = {r["planner"]: r for r in rows if r["recipe"] == recipe}
        budget_ok = all((r.get("max_budget_share") or 0.0) <= 1.0 + 1e-9 for r in mine.values())
        out.append({"recipe": recipe, "target": "budget", "holds": budget_ok,
                    "detail": "max share of budget charged: "
                              f"{max((r.get('max_budget_share') or 0.0) for r in mine.values()):.3f}"})
        ours = mine.get(planner)
        if ours is None or ours.get("mean_gain") is None:
            continue
        for other, factor in FACTOR.items():
            theirs = mine.get(other)
            if theirs is None or theirs.get("mean_gain") is None:
                continue
            holds = ours["mean_gain"] > 0 and ours["mean_gain"] >= factor * theirs["mean_gain"] - 1e-12
            out.append({"recipe": recipe, "target": f"gain-vs-{other}", "holds": holds,
                        "detail": f"{ours['mean_gain']:+.1%} vs {theirs['mean_gain']:+.1%} (need >= {factor:g}x)"})
        others = [r for p, r in mine.items() if p != planner and not p.startswith(ABLATION_PREFIX)
                  and r.get("mean_gain") is not None]
        if others:
            best = max(others, key=lambda r: r["mean_gain"])
            mine_h, theirs_h = ours.get("gpu_hours_to_95"), best.get("gpu_hours_to_95")
            holds = mine_h is not None and theirs_h is not None and mine_h <= 0.5 * theirs_h + 1e-9
            out.append({"recipe": recipe, "target": "speed", "holds": holds,
                        "detail": f"{_h(mine_h)} vs {best['planner']} {_h(theirs_h)} GPU-h to 95% of final gain"})
    return out


def _h(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"
