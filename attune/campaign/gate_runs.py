"""The correctness gate on one layout of a campaign, cached by content.

The gate is deterministic in its inputs (recipes, steps, seed), so its verdicts are cached under
$ATTUNE_HOME/gate-cache, keyed by those inputs and the gate's code version (a changed gate never
reuses an older one's verdicts): benchmark campaigns that gate the same recipe share them, and a
layout the planner probed before measuring it is not trained on the proxy again when it is gated
at the end.

Which trainer the convergence check watches follows the campaign's stack: on the sim stack the CPU
proxy (attune/proxy: no GPU-hours), on the torchtitan stack real torchtitan runs of the baseline
and the candidate through the campaign's own stack (gate/torchtitan_runs.py), charged to the
budget like trials. A torchtitan campaign keeps the gate's cost in reserve from its first search
trial on (gate_reserve), so the search cannot spend what the verdict needs.

A probe is the gate run early, on a numerics-tier layout (float8) the planner is about to propose:
the proxy trains on the CPU and costs no GPU-hours, a refused float8 trial costs a GPU trial and
then a fall back. A probe reads the proxy on every stack (a cheap screen); on torchtitan the
incumbent's final verdict still comes from its real runs. The campaign keeps every probe's verdict (state.gate_probes).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from attune.campaign.budget import gpu_hours
from attune.campaign.context import Campaign
from attune.files import atomic_write_text, attune_home
from attune.levers import levers_text
from attune.recipe import Recipe
from attune.space import recipe_at


def gate_report(c: Campaign, candidate: Recipe, workdir: Path, trainer: str | None = None) -> dict[str, Any]:
    """The gate's report (as JSON) on `candidate` against the campaign's recipe; `trainer` forces
    whose curves it reads (a probe always asks the proxy), by default the campaign's own."""
    from attune import gate
    from attune.gate.pipeline import code_version

    seed = c.settings.seed if c.settings.gate_seed is None else c.settings.gate_seed
    trainer = trainer or gate_trainer(c)
    key = hashlib.sha256(json.dumps([c.recipe.config, candidate.config, c.recipe.stack.model_dump(),
                                     c.recipe.cluster.model_dump(), c.settings.gate_steps, seed,
                                     code_version(), trainer], sort_keys=True, default=str).encode()).hexdigest()[:20]
    cached = attune_home() / "gate-cache" / f"{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text()) | {"cached": True}
    if trainer == "torchtitan":
        from attune.gate import torchtitan_runs
        needed = _gate_hours(c, candidate)
        if not c.state.budget.can_afford(needed):  # not cached: a larger budget may run it
            return {"passed": False, "trainer": trainer, "gpu_hours": 0.0, "seconds": 0.0,
                    "note": f"not run: the gate's torchtitan runs need about {needed:.3f} GPU-hours, "
                            f"{c.state.budget.left:.3f} left"}
        report = torchtitan_runs.verify(c.recipe, candidate, workdir, stack=c.stack, steps=c.settings.gate_steps,
                                        seed=seed, say=c.say, max_gpu_hours=c.state.budget.left)
        c.state.budget.charge(report.gpu_hours)
        c.state.gate_gpu_hours += report.gpu_hours
        c.save()
    else:
        report = gate.verify(c.recipe, candidate, workdir, steps=c.settings.gate_steps, seed=seed)
    verdict = report.model_dump(mode="json")
    atomic_write_text(cached, json.dumps(verdict))
    return verdict


def gate_trainer(c: Campaign) -> str:
    """Whose curves the convergence check reads: the recipe's own trainer where the campaign runs
    it (torchtitan), else the CPU proxy."""
    return "torchtitan" if c.settings.stack == "torchtitan" else "proxy"


def gate_reserve(c: Campaign, levers: dict[str, Any]) -> float:
    """GPU-hours the gate of a candidate with these levers will cost: nothing on the proxy; on
    torchtitan the baseline replicates (and those under the candidate's data order when its DP
    degree differs) and the candidate, each a run of gate_steps, at the stack's estimate."""
    return _gate_hours(c, c.trial_recipe(levers)) if gate_trainer(c) == "torchtitan" else 0.0


def _gate_hours(c: Campaign, candidate: Recipe) -> float:
    from attune.gate import torchtitan_runs
    runs = torchtitan_runs.plan_runs(c.recipe, candidate, c.settings.gate_steps or torchtitan_runs.DEFAULT_STEPS,
                                     seed=0)
    return sum(gpu_hours(run.recipe.cluster.gpus, c.run_wall_time_s(run.recipe, run.steps))
               for run in runs.values())


def probe_layout(c: Campaign, levers: dict[str, Any]) -> bool:
    """Whether the gate passes the recipe moved to these levers (asked once per layout)."""
    for probe in c.state.gate_probes:
        if probe["levers"] == levers:
            return bool(probe["passed"])
    candidate = recipe_at(c.recipe, levers, name=f"{c.recipe.name}-probe")
    workdir = c.directory / "probes" / f"{len(c.state.gate_probes):02d}"
    if c.say:
        base = c.recipe.layout().levers()
        moved = levers_text({k: v for k, v in levers.items() if base.get(k) != v})
        c.say(f"gate probe: the convergence check on the CPU proxy for {moved}, before any GPU trial of it")
    report = gate_report(c, candidate, workdir, trainer="proxy")
    if c.say:
        c.say(f"gate probe: {'passed' if report.get('passed') else 'refused'} ({_took(report)})")
    c.state.gate_probes.append({"levers": levers, "passed": bool(report.get("passed")),
                                "seconds": report.get("seconds"), "note": report.get("note", "")})
    c.save()
    return bool(report.get("passed"))


def _took(report: dict[str, Any]) -> str:
    return "cached" if report.get("cached") else f"{report.get('seconds') or 0:.0f} s"
