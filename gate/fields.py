"""Field classification (gate/fields.toml + the lever catalog): is a recipe field speed-only,
objective-changing, or a numerics change? Unknown fields are objective until classified."""

from __future__ import annotations

import fnmatch
import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from attune.levers import Scalar, lever_catalog

FIELDS_FILE = Path(__file__).with_name("fields.toml")
FieldClass = Literal["objective", "numerics", "speed"]
_UNSET = object()


@dataclass(frozen=True)
class FieldRule:
    field: str
    cls: FieldClass
    reason: str
    default: Scalar | None = None
    has_default: bool = False
    source: str = "fields.toml"   # fields.toml | levers.toml | pattern | unknown


@functools.cache
def _table() -> dict:
    return tomllib.loads(FIELDS_FILE.read_text())


def classify(field: str) -> FieldRule:
    """The rule for one dotted field: fields.toml, then the lever catalog, then the patterns."""
    table = _table()
    spec = table["fields"].get(field)
    if spec is not None:
        return FieldRule(field, spec["class"], spec["reason"], spec.get("default"), "default" in spec)
    lever = lever_catalog().get(field)
    if lever is not None:
        cls: FieldClass = "speed" if lever.speed_only else "numerics" if lever.numerics else "objective"
        return FieldRule(field, cls, lever.description, lever.default, True, "levers.toml")
    for pattern in table["patterns"]:
        if fnmatch.fnmatchcase(field, pattern["glob"]):
            return FieldRule(field, pattern["class"], pattern["reason"], source="pattern")
    return FieldRule(field, "objective", "unknown field: objective-changing until classified in gate/fields.toml",
                     source="unknown")


def objective_fields() -> list[str]:
    """Every field fields.toml names as objective-changing (for tests and docs)."""
    return sorted(k for k, v in _table()["fields"].items() if v["class"] == "objective")


def effective(config: dict[str, Scalar], field: str) -> object:
    """The field's value in effect: as written, else its known default, else _UNSET."""
    if field in config:
        return config[field]
    rule = classify(field)
    return rule.default if rule.has_default else _UNSET


def is_unset(value: object) -> bool:
    return value is _UNSET
