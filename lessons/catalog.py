"""The lessons catalog (lessons/catalog.toml), matched against a diagnosis.

A lesson's figure here is the catalog's guess; what campaigns measured is in the ledger
(attune.lessons.ledger, in the recipe store) and a campaign's prior combines the two
(attune.lessons.posterior).
"""

from __future__ import annotations

import functools
import operator
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from attune.layout import Layout
from attune.levers import Scalar, lever

HERE = Path(__file__).resolve().parent
CATALOG_FILE = HERE / "catalog.toml"

_OPS = {"==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


class When(BaseModel):
    symptoms: list[str]
    model: Literal["dense", "moe", "any"] = "any"
    layout: dict[str, str] = {}


class Try(BaseModel):
    lever: str
    direction: Literal["up", "down", "set"]
    value: Scalar | None = None


class Lesson(BaseModel):
    id: str
    title: str
    when: When
    try_: Try = Field(alias="try")
    expected: str
    expected_gain: float

    def applies(self, symptoms: set[str], is_moe: bool, layout: Layout) -> bool:
        if self.when.model != "any" and (self.when.model == "moe") != is_moe:
            return False
        if not symptoms.intersection(self.when.symptoms):
            return False
        return all(_condition(getattr(layout, attr), cond) for attr, cond in self.when.layout.items())

    def move(self, layout: Layout, domain: list[Scalar]) -> dict[str, Scalar] | None:
        """The one-lever change this lesson suggests from `layout`, or None if there is none."""
        current = layout.levers()[self.try_.lever]
        if self.try_.direction == "set":
            target = self.try_.value
        else:
            ordered = list(lever(self.try_.lever).values) if lever(self.try_.lever).kind == "choice" else sorted(domain)
            ordered = [v for v in ordered if v in domain] or ordered
            if current not in ordered:
                return None
            i = ordered.index(current) + (1 if self.try_.direction == "up" else -1)
            if not 0 <= i < len(ordered):
                return None
            target = ordered[i]
        if target == current or target not in domain:
            return None
        return {self.try_.lever: target}


def _condition(value: Any, cond: str) -> bool:
    for symbol in (">=", "<=", "==", "!=", ">", "<"):
        if cond.startswith(symbol):
            raw = cond[len(symbol):].strip()
            target: Any = raw
            if raw in ("true", "false"):
                target = raw == "true"
            elif raw.lstrip("-").isdigit():
                target = int(raw)
            return _OPS[symbol](value, target)
    raise ValueError(f"bad layout condition {cond!r}")


@functools.cache
def _catalog_raw() -> dict:
    return tomllib.loads(CATALOG_FILE.read_text())


def catalog_version() -> int:
    return int(_catalog_raw()["catalog_version"])


def load_lessons() -> list[Lesson]:
    return [Lesson.model_validate(raw) for raw in _catalog_raw()["lesson"]]


def match(lessons: list[Lesson], symptoms: set[str], is_moe: bool, layout: Layout) -> list[Lesson]:
    """Lessons that apply, best catalog figure first."""
    return sorted((ls for ls in lessons if ls.applies(symptoms, is_moe, layout)), key=lambda ls: -ls.expected_gain)
