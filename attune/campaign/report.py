"""The campaign report a person reads: the trial table and the outcome, as markdown."""

from __future__ import annotations

from typing import Any

from attune.campaign.budget import hours_text
from attune.campaign.context import Campaign
from attune.levers import levers_text


def trial_table(c: Campaign) -> str:
    base = c.state.baseline_tps
    base_mean = sum(base) / len(base) if base else 0.0
    rows = ["| # | role | move | lesson | status | tok/s/GPU | vs baseline | MFU | mem GiB | GPU-h | diagnosis |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in c.state.trials:
        r = t.result
        gain = f"{t.tps / base_mean - 1:+.1%}" if (r.ok and base_mean) else ""
        mark = " **(incumbent)**" if t.index == c.state.incumbent else ""
        rows.append(f"| {t.index} | {t.role}{mark} | {levers_text(t.move)} | {t.lesson_id or ''} | {r.status.value} | "
                    f"{(r.tokens_per_sec_per_gpu or 0):,.0f} | {gain} | {(r.mfu or 0):.1%} | "
                    f"{(r.peak_memory_gib or 0):.1f} | {hours_text(r.gpu_hours)} | "
                    f"{', '.join(s.id for s in t.diagnosis)} |")
    return "\n".join(rows)


def _probes_line(probes: list[dict[str, Any]]) -> str:
    if not probes:
        return "- gate probes: none"
    passed = sum(bool(p["passed"]) for p in probes)
    return (f"- gate probes (the gate on the CPU proxy before a float8 trial, no GPU-hours): {len(probes)}, "
            f"{passed} passed")


def report_markdown(c: Campaign, result: dict[str, Any]) -> str:
    label = " (simulated)" if result.get("simulated") else ""
    best = result["best"]["levers"]
    base = result["baseline"]["levers"]
    changed = {k: v for k, v in best.items() if base.get(k) != v}
    payback = result.get("payback_hours")
    gate = result.get("gate") or {}
    lines = [
        f"# ATTUNE campaign {result['campaign_id']}{label}",
        f"**{result['recipe']}** — {result['model']} on {result['cluster']}, stack `{result['stack']}`, "
        f"planner `{result['planner']}`",
        "",
        f"- outcome: {result['stop_reason']}",
        f"- baseline {result['baseline']['tokens_per_sec_per_gpu']:,.0f} → best "
        f"{result['best']['tokens_per_sec_per_gpu']:,.0f} tokens/s/GPU ({result['gain']:+.1%}); "
        f"noise band {(result['noise_band'] or 0):.1%}",
        f"- changed: {levers_text(changed) or 'nothing'}",
        f"- GPU-hours {hours_text(result['gpu_hours_used'])} of {hours_text(result['budget_gpu_hours'])}; "
        f"{result['trials']} trials" + (f"; the gate's own runs {hours_text(result['gate_gpu_hours'])}"
                                        if result.get("gate_gpu_hours") else ""),
        f"- payback: {payback:.1f} h of training on this cluster" if payback else "- payback: n/a (nothing shipped)",
        f"- gate: {'passed' if gate.get('passed') else 'not passed' if gate else 'not run'}"
        + (f" (convergence check on {gate['trainer']} curves)" if gate.get("trainer") else ""),
        _probes_line(result.get("gate_probes") or []),
        "",
        "## Trials",
        trial_table(c),
    ]
    return "\n".join(lines) + "\n"

