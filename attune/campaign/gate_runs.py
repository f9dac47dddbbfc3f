"""The correctness gate on one layout of a campaign, cached by content.

The gate is deterministic in its inputs (recipes, steps, seed), so its verdicts are cached under
$ATTUNE_HOME/gate-cache: benchmark campaigns that gate the same recipe share them, and a layout the
planner probed before measuring it is not trained on the proxy again when it is gated at the end.

A probe is the gate run early, on a numerics-tier layout (float8) the planner is about to propose:
the proxy trains on the CPU and costs no GPU-hours, a refused float8 trial costs a GPU trial and
then a fall back. The campaign keeps every probe's verdict (state.gate_probes).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attune.campaign.state import attune_home
from attune.levers import levers_text
from attune.recipe import Recipe
from attune.space import config_for

if TYPE_CHECKING:
    from attune.campaign.engine import Campaign


def gate_report(c: Campaign, candidate: Recipe, workdir: Path) -> dict[str, Any]:
    """The gate's report (as JSON) on `candidate` against the campaign's recipe."""
    import gate

    seed = c.settings.seed if c.settings.gate_seed is None else c.settings.gate_seed
    key = hashlib.sha256(json.dumps([c.recipe.config, candidate.config, c.recipe.stack.model_dump(),
                                     c.settings.gate_steps, seed, gate.__name__],
                                    sort_keys=True, default=str).encode()).hexdigest()[:20]
    cached = attune_home() / "gate-cache" / f"{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text()) | {"cached": True}
    report = gate.verify(c.recipe, candidate, workdir, steps=c.settings.gate_steps, seed=seed)
    verdict = report.model_dump(mode="json")
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps(verdict))
    tmp.replace(cached)
    return verdict


def probe_layout(c: Campaign, levers: dict[str, Any]) -> bool:
    """Whether the gate passes the recipe moved to these levers (asked once per layout)."""
    for probe in c.state.gate_probes:
        if probe["levers"] == levers:
            return bool(probe["passed"])
    candidate = c.recipe.with_config(config_for(c.recipe, levers), name=f"{c.recipe.name}-probe")
    workdir = c.directory / "probes" / f"{len(c.state.gate_probes):02d}"
    if c.say:
        base = c.recipe.layout().levers()
        moved = levers_text({k: v for k, v in levers.items() if base.get(k) != v})
        c.say(f"gate probe: the convergence check on the CPU proxy for {moved}, before any GPU trial of it")
    report = gate_report(c, candidate, workdir)
    if c.say:
        c.say(f"gate probe: {'passed' if report.get('passed') else 'refused'} ({_took(report)})")
    c.state.gate_probes.append({"levers": levers, "passed": bool(report.get("passed")),
                                "seconds": report.get("seconds"), "note": report.get("note", "")})
    c.save()
    return bool(report.get("passed"))


def _took(report: dict[str, Any]) -> str:
    return "cached" if report.get("cached") else f"{report.get('seconds') or 0:.0f} s"
