"""After the search: gate the incumbent, ship it or keep the baseline, the result, the moves for the lessons ledger."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from attune.campaign import lessons_ledger, store_campaigns
from attune.campaign.context import Campaign
from attune.campaign.engine import mean_tps, protocol_of
from attune.campaign.gate_runs import gate_report
from attune.campaign.payback import payback_hours
from attune.recipe import Recipe, write_recipe
from attune.levers import layout_key


def candidate_recipe(c: Campaign) -> Recipe:
    incumbent = c.state.incumbent_record
    return c.recipe.with_config(incumbent.config, name=f"{c.recipe.name}-attune")


def run_gate(c: Campaign) -> dict[str, Any]:
    """The correctness gate on the incumbent (the gate never sees the planner; its verdicts are
    cached by content, attune.campaign.gate_runs)."""
    c.state.gate = gate_report(c, candidate_recipe(c), c.directory / "gate")
    c.save()
    return c.state.gate


def ship(c: Campaign, out_path: Path | None) -> Path | None:
    """Write the verified recipe (a recipe file the same tools accept again)."""
    incumbent = c.state.incumbent_record
    if incumbent is None or incumbent.role == "baseline" or not (c.state.gate or {}).get("passed"):
        c.state.shipped = False
        c.save()
        return None
    path = write_recipe(candidate_recipe(c), out_path or c.directory / "shipped.toml")
    c.state.shipped = True
    c.state.recipe_out = str(path)
    c.save()
    return path


def baseline_defects(c: Campaign) -> list[dict[str, str]]:
    """Known stack defects the recipe as given already matches: a campaign cannot fix what the gate
    compares against, so it says so (every faster layout that keeps the defect is refused)."""
    from attune.gate.defects import match

    return [{"id": hit.id, "source": hit.source} for hit in match(c.recipe)]


def final_message(c: Campaign) -> str:
    search = c.state.stop_reason or "finished"
    hits = baseline_defects(c)
    if hits:
        search += ("; note: the recipe as given matches known defect(s) "
                   + ", ".join(f"{h['id']} ({h['source']})" for h in hits))
    if c.state.rejected:
        search += (f"; the gate refused the best candidate ({_why(c.state.rejected[-1]['gate'])}), "
                   f"so the best one the config check passes without a numerics change was confirmed and "
                   f"gated instead")
    if c.state.skipped:
        search += "; measured other than the fixed protocol: " + "; ".join(c.state.skipped)
    if c.state.shipped:
        return f"{search}; shipped {c.state.recipe_out}"
    gate = c.state.gate
    if gate is not None and not gate.get("passed"):
        outcome = "inconclusive" if gate.get("verdict") == "inconclusive" else "failed"
        return f"{search}; gate {outcome} ({_why(gate)}), kept the baseline recipe"
    return f"{search}; kept the baseline recipe"


def _why(gate: dict[str, Any]) -> str:
    why = [v.get("field", "") + ": " + v.get("reason", "") for v in gate.get("config", {}).get("violations", [])]
    why += [d.get("id", "") for d in gate.get("config", {}).get("defects", [])]
    conv = gate.get("convergence") or {}
    if conv and conv.get("verdict") == "inconclusive":
        steps = conv.get("need_more_steps")
        why.append("convergence inconclusive" + (f": about {steps} steps would decide it" if steps else ""))
    elif conv and conv.get("passed") is False:
        why.append("convergence: " + str(conv.get("reason", "loss curve outside the baseline band")))
    if not why and gate.get("note"):
        why.append(str(gate["note"]))
    return "; ".join(why) or "see gate report"


def summary(record_levers: dict[str, Any], c: Campaign) -> dict[str, Any]:
    records = [t for t in c.state.measured(record_levers) if t.result.ok]
    first = records[0].result if records else None
    return {"levers": record_levers, "tokens_per_sec_per_gpu": mean_tps(c, record_levers),
            "mfu": first.mfu if first else None, "step_time_s": first.step_time_s if first else None,
            "peak_memory_gib": first.peak_memory_gib if first else None, "replicates": len(records)}


def protocol_summary(c: Campaign) -> dict[str, Any]:
    """How the campaign measured (attune.campaign.protocol): fixed or fitted to the budget, why, the runs
    it measured in each role, and what it skipped of the fixed protocol and why."""
    p = protocol_of(c)
    return {"fitted": p.fitted, "why": p.why, "screen_steps": p.screen_steps,
            "baseline_runs": len(c.state.of_role("baseline")), "confirm_runs": len(c.state.of_role("confirm")),
            "skipped": list(c.state.skipped)}


def campaign_result(c: Campaign) -> dict[str, Any]:
    s = c.state
    baseline_levers = s.of_role("baseline")[0].levers
    best_levers = s.incumbent_record.levers if s.shipped else baseline_levers
    base = summary(baseline_levers, c)
    best = summary(best_levers, c)
    gain = best["tokens_per_sec_per_gpu"] / base["tokens_per_sec_per_gpu"] - 1 if base["tokens_per_sec_per_gpu"] else 0.0
    result = {
        "campaign_id": s.campaign_id, "recipe": c.recipe.name, "model": c.recipe.model_name,
        "cluster": c.recipe.cluster.label, "stack": c.settings.stack, "planner": c.settings.planner,
        "simulated": c.settings.stack == "sim",
        "baseline": base, "best": best, "gain": gain, "noise_band": s.noise_band,
        "gpu_hours_used": s.budget.spent_gpu_hours, "budget_gpu_hours": s.budget.total_gpu_hours,
        "gate_gpu_hours": s.gate_gpu_hours, "lost_gpu_hours": s.lost_gpu_hours, "trials": len(s.trials), "stop_reason": final_message(c),
        "gate": s.gate, "shipped": s.shipped,
        "gate_rejected": [{"levers": r["levers"], "reason": _why(r["gate"])} for r in s.rejected],
        "gate_probes": [{"levers": p["levers"], "passed": p["passed"]} for p in s.gate_probes],
        "baseline_defects": baseline_defects(c),
        "protocol": protocol_summary(c),
        "payback_hours": payback_hours(s.budget.spent_gpu_hours, gain, c.recipe.cluster.gpus) if s.shipped else None,
        "mlflow_run_id": s.mlflow_run_id, "recipe_out": s.recipe_out, "campaign_dir": str(c.directory),
    }
    if s.llm_usage:
        result["llm_usage"] = s.llm_usage
    if s.warm is not None:
        holds = bool(s.warm.map and s.warm.map.holds)
        old = {layout_key(lay.levers) for lay in s.warm.layouts}
        ran = {layout_key(t.levers): t.levers for t in s.trials if t.result.ok and layout_key(t.levers) in old}
        result["warm_start"] = {"source": s.warm.source, "remeasured": list(ran.values()),
                                "layouts_carried": len(s.warm.layouts) if holds else 0,
                                "map": s.warm.map.model_dump() if s.warm.map else None}
    s.result = result
    c.save()
    return result


def update_lessons(c: Campaign, store_uri: str | None = None) -> int:
    """Leave in the recipe store what later campaigns start from: the campaign's moves in the lessons
    ledger, once, and its state, for a warm start on another machine (attune.campaign.store_campaigns).
    A resumed campaign's objects replace the ones it wrote before it was killed."""
    store_campaigns.keep(c, store_uri)
    return lessons_ledger.record(c, store_uri)


def publish_to_store(c: Campaign, store_uri: str | None) -> bool:
    """Put the shipped recipe into the recipe store (TrainingThroughputBench); the store keeps the
    better verified recipe per model, cluster and stack."""
    from attune.store import StoreEntry, cost_per_million_tokens, open_store

    result = c.state.result or campaign_result(c)
    best = result["best"]
    cluster = c.recipe.cluster
    entry = StoreEntry(
        model=c.recipe.model_name, accelerator=cluster.accelerator, gpus=cluster.gpus,
        gpus_per_node=cluster.gpus_per_node, stack=c.recipe.stack.model_dump(exclude_none=True),
        stack_fingerprint=c.recipe.stack.fingerprint(),
        recipe_toml=Path(c.state.recipe_out).read_text(), levers=best["levers"],
        tokens_per_sec_per_gpu=best["tokens_per_sec_per_gpu"], mfu=best["mfu"], step_time_s=best["step_time_s"],
        peak_memory_gib=best["peak_memory_gib"],
        cost_per_million_tokens=cost_per_million_tokens(cluster.accelerator, cluster.gpus,
                                                        best["tokens_per_sec_per_gpu"], cluster.price),
        gate_passed=bool((c.state.gate or {}).get("passed")), gate_report=c.state.gate or {},
        mlflow_run_id=c.state.mlflow_run_id or "", simulated=c.settings.stack == "sim",
        measured_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        campaign={"campaign_id": c.state.campaign_id, "gain": result["gain"],
                  "gpu_hours_used": result["gpu_hours_used"], "planner": c.settings.planner})
    kept, _current = open_store(store_uri).put(entry)
    return kept
