"""What the gate's public config check says of a layout, before any training: whether it passes
(no objective change, no known stack defect) and whether it changes numerics (float8: the
convergence check on the proxy then decides). Planners use it to skip trials that could never
ship; the campaign uses it to choose what to fall back on when the gate refuses a candidate."""

from __future__ import annotations

from typing import Any

from attune.recipe import Recipe
from attune.space import config_for


def gate_verdict(recipe: Recipe, levers: dict[str, Any]) -> tuple[bool, bool]:
    """(passes the config check, changes numerics) for the recipe moved to these levers."""
    from gate.config_check import check_config

    verdict = check_config(recipe, recipe.with_config(config_for(recipe, levers)))
    return verdict.passed, bool(verdict.numerics_change)
