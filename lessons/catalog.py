"""The lessons catalog (lessons/catalog.toml) and its evidence, matched against a diagnosis.

Evidence ships in lessons/evidence.json and grows with every campaign in
$ATTUNE_HOME/lessons-evidence.json; a lesson's prior is its expected gain, pulled toward what
campaigns measured once there is evidence.
"""

from __future__ import annotations

import functools
import json
import operator
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from attune.files import atomic_write_text, locked, attune_home
from attune.layout import Layout
from attune.levers import Scalar, lever

HERE = Path(__file__).resolve().parent
CATALOG_FILE = HERE / "catalog.toml"
SHIPPED_EVIDENCE = HERE / "evidence.json"

_OPS = {"==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


class When(BaseModel):
    symptoms: list[str]
    model: Literal["dense", "moe", "any"] = "any"
    layout: dict[str, str] = {}


class Try(BaseModel):
    lever: str
    direction: Literal["up", "down", "set"]
    value: Scalar | None = None


class Evidence(BaseModel):
    lesson: str
    campaign: str
    model: str
    cluster: str
    stack: str
    gain: float | None = None      # measured relative change vs the parent layout (None: failed run)
    won: bool = False
    at: str = ""


class Lesson(BaseModel):
    id: str
    title: str
    when: When
    try_: Try = Field(alias="try")
    expected: str
    expected_gain: float
    evidence: list[Evidence] = []

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

    @property
    def prior(self) -> float:
        """Expected gain, shrunk toward the measured mean as evidence accumulates (2 pseudo-counts)."""
        measured = [e.gain for e in self.evidence if e.gain is not None]
        if not measured:
            return self.expected_gain
        return (2 * self.expected_gain + sum(measured)) / (2 + len(measured))


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


def user_evidence_file() -> Path:
    """Where finished campaigns append evidence: $ATTUNE_HOME/lessons-evidence.json."""
    return attune_home() / "lessons-evidence.json"


def load_evidence(extra_file: Path | None = None) -> list[Evidence]:
    rows: list[dict] = []
    for path in (SHIPPED_EVIDENCE, extra_file):
        if path is not None and path.is_file():
            rows.extend(json.loads(path.read_text()))
    return [Evidence(**row) for row in rows]


def load_lessons(evidence_file: Path | None = None) -> list[Lesson]:
    evidence = load_evidence(evidence_file or user_evidence_file())
    lessons = []
    for raw in _catalog_raw()["lesson"]:
        lesson = Lesson.model_validate(raw)
        lesson.evidence = [e for e in evidence if e.lesson == lesson.id]
        lessons.append(lesson)
    return lessons


def match(lessons: list[Lesson], symptoms: set[str], is_moe: bool, layout: Layout) -> list[Lesson]:
    """Lessons that apply, best prior first."""
    return sorted((ls for ls in lessons if ls.applies(symptoms, is_moe, layout)), key=lambda ls: -ls.prior)


def append_evidence(path: Path, rows: list[Evidence]) -> None:
    """Add a campaign's outcomes to the evidence file (atomic rewrite). Rows of the same campaign
    already there are replaced, so a campaign killed after writing them and resumed counts once;
    concurrent campaigns take turns (each reads what the other wrote)."""
    campaigns = {row.campaign for row in rows}
    with locked(path.with_name(path.name + ".lock")):
        existing = json.loads(path.read_text()) if path.is_file() else []
        kept = [row for row in existing if row.get("campaign") not in campaigns]
        kept.extend(row.model_dump() for row in rows)
        atomic_write_text(path, json.dumps(kept, indent=1))
