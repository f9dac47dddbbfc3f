"""Planners by name: `--planner attune|random|bayes|estimator-topk|grid|llm`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attune.errors import InputError


def _attune(seed: int = 0, disabled_rules: frozenset[str] = frozenset(), **_: Any):
    from attune.planners.attune_planner import RULES, AttunePlanner
    unknown = set(disabled_rules) - set(RULES)
    if unknown:
        raise InputError("--disable-rule", f"unknown rule(s) {', '.join(sorted(unknown))}; rules: {', '.join(RULES)}")
    return AttunePlanner(disabled=frozenset(disabled_rules))


PLANNERS: dict[str, Callable[..., Any]] = {"attune": _attune}


def register_planner(name: str, factory: Callable[..., Any]) -> None:
    PLANNERS[name] = factory


def make_planner(name: str, **options: Any):
    _load_optional()
    if name not in PLANNERS:
        raise InputError("--planner", f"unknown planner {name!r}; choose from {', '.join(sorted(PLANNERS))}")
    return PLANNERS[name](**options)


def planner_names() -> list[str]:
    _load_optional()
    return sorted(PLANNERS)


def _load_optional() -> None:
    """Planners in their own modules register themselves on import (baselines, llm)."""
    import importlib
    for module in ("attune.planners.baselines", "attune.planners.llm"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
