"""What the gate's public config check says of a layout, before any training: whether it passes
(no objective change, no known stack defect) and whether it changes numerics (float8: the
convergence check on the proxy then decides). Planners use it to skip trials that could never
ship; the campaign uses it to choose what to fall back on when the gate refuses a candidate."""

from __future__ import annotations

from typing import Any

from attune.levers import layout_key
from attune.recipe import Recipe
from attune.space import recipe_at

_VERDICTS: dict[tuple[str, tuple], tuple[bool, bool]] = {}   # the one memo of the config check (~10 ms a call)
_MEMO_LIMIT = 200_000


def gate_verdict(recipe: Recipe, levers: dict[str, Any]) -> tuple[bool, bool]:
    """(passes the config check, changes numerics) for the recipe moved to these levers; memoised
    by the recipe's content and the levers (the check is a pure function of both)."""
    from attune.gate.config_check import check_config

    key = (recipe.model_dump_json(), layout_key(levers))
    if key not in _VERDICTS:
        if len(_VERDICTS) >= _MEMO_LIMIT:
            _VERDICTS.clear()
        verdict = check_config(recipe, recipe_at(recipe, levers))
        _VERDICTS[key] = (verdict.passed, bool(verdict.numerics_change))
    return _VERDICTS[key]
