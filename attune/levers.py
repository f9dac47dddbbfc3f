"""The lever catalog (attune/data/levers.toml): which recipe fields a tuner may move, and their domains;
and the [config] keys a recipe may set at all (attune/data/config_keys.toml plus the levers)."""

from __future__ import annotations

import difflib
import functools
import math
import tomllib
from dataclasses import dataclass, field
from typing import Any

from attune.data_files import load_data
from attune.errors import InputError

Scalar = int | float | bool | str
# An int lever above this is a typo (a degree, a batch or a count of a million or more), refused
# up front rather than by a budget or memory estimate deep in a campaign; levers.toml may set `max`.
INT_LEVER_MAX = 1 << 20


@dataclass(frozen=True)
class Lever:
    key: str
    kind: str  # int | bool | choice
    values: tuple[Scalar, ...]
    default: Scalar
    speed_only: bool
    description: str
    numerics: bool = False  # speed lever that changes numerics: the gate wants a convergence check
    max: int = INT_LEVER_MAX  # int levers only
    seq_block: int = 1  # a sequence-splitting lever above 1 needs seq_len divisible by value x seq_block
    # choice levers: value -> the rule its pipeline micro-batch count must keep (attune.layout.MICROBATCH_RULES)
    microbatches: dict[str, str] = field(default_factory=dict, compare=False)
    # choice levers: value -> {other lever: a value it cannot run with} (attune.layout.layout_violations)
    excludes: dict[str, dict[str, Scalar]] = field(default_factory=dict, compare=False)

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
            if value > self.max:
                raise InputError(self.key, f"must be at most {self.max:,}, got {value:,}")
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


@functools.cache
def config_keys() -> frozenset[str]:
    """Every [config] key a recipe may set: torchtitan's field names (0.3's, and 0.2's that the gate
    classifies or an alias maps), generated into config_keys.toml, and the levers."""
    return frozenset(load_data("config_keys")["keys"]) | frozenset(lever_catalog())


def check_config_key(key: str, field: str | None = None) -> None:
    """InputError for a key that is no known field (a typo would be shipped as written and never take
    effect), naming the nearest known key."""
    known = config_keys()
    if key in known:
        return
    near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    hint = (f"did you mean {near[0]}?" if near
            else "known keys are torchtitan's field names (attune/data/config_keys.toml)")
    raise InputError(field or key, f"unknown config key; {hint}")


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
    """`--set key=value` pairs: keys must be known config keys; levers are type-checked against the catalog."""
    out: dict[str, Scalar] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise InputError("--set", f"expected key=value, got {item!r}")
        check_config_key(key, f"--set {key}")
        value = parse_value(text)
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"--set {key}", f"must be a finite number, got {text}")
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
