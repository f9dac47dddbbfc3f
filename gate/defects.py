"""The known-defects catalog (gate/defects.toml) and its matcher.

An entry applies when its component's package is in the recipe's [stack] with a version inside
the entry's range, every other package range it names holds where the stack carries that package
(one the stack does not carry is reported as unverified, not assumed), and every config condition
holds on the candidate's effective config and resolved layout.
"""

from __future__ import annotations

import functools
import operator
import tomllib
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, field_validator

from attune.recipe import Recipe
from attune.gate.fields import effective, is_unset
from attune.gate.models import DefectHit

DEFECTS_FILE = Path(__file__).with_name("defects.toml")
_OPS = {"==": operator.eq, "!=": operator.ne, ">=": operator.ge, "<=": operator.le, ">": operator.gt,
        "<": operator.lt, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}


class Defect(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    component: str                      # the package whose version decides (torchtitan, torch, deepspeed, ...)
    versions: dict[str, str]            # package -> PEP 440 specifier set
    when: list[str] = []                # "key op literal"; key: config field, layout.X, model.is_moe, cluster.X
    symptom: str
    source: str
    fix: str = ""
    range_note: str = ""                # how the range was established, and what is uncertain

    @field_validator("versions")
    @classmethod
    def _specifiers(cls, value: dict[str, str]) -> dict[str, str]:
        for spec in value.values():
            SpecifierSet(spec)  # raises InvalidSpecifier on a typo in the catalog
        return value


@functools.cache
def catalog() -> tuple[Defect, ...]:
    raw = tomllib.loads(DEFECTS_FILE.read_text())["defects"]
    entries = tuple(Defect(**entry) for entry in raw)
    ids = [d.id for d in entries]
    if len(ids) != len(set(ids)):
        raise ValueError("gate/defects.toml: duplicate ids")
    return entries


def stack_versions(recipe: Recipe) -> dict[str, str]:
    """Every package version the recipe's [stack] carries (extra packages included, if the spec allows)."""
    data = recipe.stack.model_dump(exclude_none=True)
    data |= {k: v for k, v in (recipe.stack.model_extra or {}).items() if v is not None}
    return {k: str(v) for k, v in data.items()}


def bad_versions(recipe: Recipe) -> list[str]:
    out = []
    for pkg, text in stack_versions(recipe).items():
        try:
            Version(text)
        except InvalidVersion:
            out.append(pkg)
    return out


def _lookup(recipe: Recipe, key: str) -> Any:
    if key.startswith("layout."):
        layout = recipe.layout()
        name = key.split(".", 1)[1]
        return getattr(layout, name)
    if key == "model.is_moe":
        return recipe.architecture.is_moe
    if key.startswith("cluster."):
        return getattr(recipe.cluster, key.split(".", 1)[1])
    return effective(recipe.config, key)


def _parse(condition: str) -> tuple[str, str, Any]:
    for op in ("not in", " in ", ">=", "<=", "==", "!=", ">", "<"):
        key, sep, literal = condition.partition(op)
        if sep:
            value = tomllib.loads(f"v = {literal.strip()}")["v"]
            return key.strip(), op.strip(), value
    raise ValueError(f"gate/defects.toml: cannot parse condition {condition!r}")


def _holds(recipe: Recipe, condition: str) -> bool:
    key, op, value = _parse(condition)
    actual = _lookup(recipe, key)
    if is_unset(actual):
        return False  # a field neither set nor defaulted: the condition cannot be shown to hold
    try:
        return bool(_OPS[op](actual, value))
    except TypeError:
        return False


def in_range(recipe: Recipe) -> list[tuple[Defect, list[str], list[str]]]:
    """The catalog entries whose version ranges hold for `recipe`'s stack, whatever its config: each
    with the versions that matched and those the stack does not carry (unverified)."""
    stack = stack_versions(recipe)
    out = []
    for defect in catalog():
        if defect.component not in stack:
            continue
        matched, unverified, applies = [], [], True
        for pkg, spec in defect.versions.items():
            if pkg not in stack:
                unverified.append(f"{pkg} {spec}")
                if pkg == defect.component:
                    applies = False
                continue
            try:
                inside = Version(stack[pkg]) in SpecifierSet(spec, prereleases=True)
            except (InvalidVersion, InvalidSpecifier):
                inside = False
            if not inside:
                applies = False
                break
            matched.append(f"{pkg} {stack[pkg]} in {spec}")
        if applies:
            out.append((defect, matched, unverified))
    return out


def parse_condition(condition: str) -> tuple[str, str, Any]:
    """A `when` condition as (key, operator, literal)."""
    return _parse(condition)


def match(recipe: Recipe) -> list[DefectHit]:
    """The catalog entries that apply to `recipe`'s stack and config."""
    hits = []
    for defect, matched, unverified in in_range(recipe):
        if not all(_holds(recipe, c) for c in defect.when):
            continue
        hits.append(DefectHit(id=defect.id, source=defect.source, component=defect.component,
                              symptom=defect.symptom, matched=matched + list(defect.when),
                              unverified=unverified, range_note=defect.range_note))
    return hits
