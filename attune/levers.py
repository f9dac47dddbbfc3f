"""The lever catalog (attune/data/levers.toml): which recipe fields a tuner may move, and their domains."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from typing import Any

from attune.data_files import load_data
from attune.errors import InputError

Scalar = int | float | bool | str


@dataclass(frozen=True)
class Lever:
    key: str
    kind: str  # int | bool | choice
    values: tuple[Scalar, ...]
    default: Scalar
    speed_only: bool
    description: str
    numerics: bool = False  # speed lever that changes numerics: the gate wants a convergence check

    def coerce(self, value: Any) -> Scalar:
        """The value in this lever's type, or an InputError naming the lever and its rule."""
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise InputError(self.key, f"must be true or false, got {value!r}")
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(self.key, f"must be an integer, got {value!r}")
            if value == 0 or value < -1:
                raise InputError(self.key, f"must be a positive integer (or -1 where allowed), got {value}")
            return value
        if value not in self.values:
            raise InputError(self.key, f"must be one of {', '.join(map(str, self.values))}, got {value!r}")
        return value


@functools.cache
def lever_catalog() -> dict[str, Lever]:
    table = load_data("levers")["levers"]
    return {key: Lever(key=key, values=tuple(spec.pop("values")), **spec)
            for key, spec in ((k, dict(v)) for k, v in table.items())}


def lever(key: str) -> Lever:
    catalog = lever_catalog()
    if key not in catalog:
        raise InputError(key, f"not a lever; levers are: {', '.join(sorted(catalog))}")
    return catalog[key]


def speed_levers() -> list[str]:
    """Levers a tuner may move: speed-only ones and numerics-only ones (float8)."""
    return [k for k, lv in lever_catalog().items() if lv.speed_only or lv.numerics]


def parse_value(text: str) -> Scalar:
    """A `--set` value in TOML's scalar syntax: 8, 1e-4, true, "full" (quotes optional for words)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_set_flags(items: list[str] | None) -> dict[str, Scalar]:
    """`--set key=value` pairs; keys that are levers are type-checked against the catalog."""
    out: dict[str, Scalar] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise InputError("--set", f"expected key=value, got {item!r}")
        value = parse_value(text)
        catalog = lever_catalog()
        out[key] = catalog[key].coerce(value) if key in catalog else value
    return out


def layout_key(levers: dict[str, Any]) -> tuple:
    """The one hashable key of a lever assignment: the same levers, the same key, in any order."""
    return tuple(sorted(levers.items()))


def levers_text(levers: dict[str, Any] | None) -> str:
    """Levers as short text for people: the last part of each key, e.g. "tensor_parallel_degree=2, float8=rowwise"."""
    if not levers:
        return ""
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in levers.items())
