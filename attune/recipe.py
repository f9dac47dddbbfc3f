"""Recipe: a model, a cluster, a stack and the torchtitan config fields that define one training job.

Recipe files are TOML in the shape documented in the README; `load_recipe` reads them and
`dump_recipe` writes one the same tools accept again.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from attune.data_files import read_toml
from attune.errors import InputError
from attune.files import atomic_write_text
from attune.layout import Layout, resolve_layout
from attune.levers import Scalar, check_config_key
from attune.spec import ClusterSpec, ModelSpec, StackSpec, catalog_model, load_model_spec
from attune.validation import first_error, name_rule


class TorchtitanLaunch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    module: str
    config: str


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    model: str | None = None
    model_spec: str | None = None  # path to a JSON/TOML spec, absolute once loaded
    cluster: ClusterSpec
    stack: StackSpec
    torchtitan: TorchtitanLaunch | None = None
    config: dict[str, Scalar] = {}
    # Candidate values a tuner may try per lever, narrowing the lever catalog's (a stack that runs
    # only some schedules, a team that never compiles). Empty: the catalog's whole domain.
    search: dict[str, list[Scalar]] = {}

    @field_validator("search")
    @classmethod
    def _search_levers(cls, value: dict[str, list[Scalar]]) -> dict[str, list[Scalar]]:
        from attune.levers import lever_catalog
        catalog = lever_catalog()
        for key, values in value.items():
            if key not in catalog:
                raise ValueError(f"search.{key}: not a lever; levers are: {', '.join(sorted(catalog))}")
            if not values:
                raise ValueError(f"search.{key}: needs at least one value")
            for v in values:
                if v not in catalog[key].values:
                    raise ValueError(f"search.{key}: {v!r} is not one of the lever's values "
                                     f"({', '.join(map(str, catalog[key].values))})")
        return value

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return name_rule(value)

    @model_validator(mode="after")
    def _one_model(self) -> "Recipe":
        if (self.model is None) == (self.model_spec is None):
            raise ValueError("exactly one of `model` (a catalog name) or `model_spec` (a file) is required")
        return self

    @property
    def architecture(self) -> ModelSpec:
        if self.model_spec is not None:
            path = Path(self.model_spec)
            return _spec_from_file(str(path), path.stat().st_mtime if path.is_file() else 0.0)
        return catalog_model(self.model)

    @property
    def model_name(self) -> str:
        return self.model if self.model is not None else self.architecture.name

    def layout(self) -> Layout:
        return resolve_layout(self.config, self.architecture, self.cluster)

    def with_config(self, config: dict[str, Scalar], name: str | None = None) -> "Recipe":
        return self.model_copy(update={"config": dict(config), "name": name or self.name})

    def on_cluster(self, cluster: ClusterSpec) -> "Recipe":
        return self.model_copy(update={"cluster": cluster})

    def with_model_spec(self, path: str | Path) -> "Recipe":
        path = Path(path).resolve()
        load_model_spec(path)  # fail now, with the file's own error
        return self.model_copy(update={"model": None, "model_spec": str(path)})


@functools.lru_cache(maxsize=64)
def _spec_from_file(path: str, _mtime: float) -> ModelSpec:
    return load_model_spec(path)


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """`[config]` keys may be written quoted ("a.b" = 1) or as nested tables (a.b = 1): both mean a.b."""
    out: dict[str, Scalar] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= _flatten(value, dotted + ".")
        elif isinstance(value, (list, tuple)):
            raise InputError(f"config.{dotted}", "recipe config values must be scalars")
        elif isinstance(value, float) and not math.isfinite(value):
            # TOML has inf and nan; no torchtitan field means either, and JSON output cannot carry them
            raise InputError(f"config.{dotted}", f"must be a finite number, got {value}")
        else:
            out[dotted] = value
    return out


def _config(table: dict[str, Any], origin: str) -> dict[str, Scalar]:
    try:
        return _flatten(table)
    except InputError as err:
        raise InputError(f"{origin}: {err.field}", err.rule) from None


def recipe_from_dict(raw: dict[str, Any], base_dir: Path | None = None, origin: str = "recipe") -> Recipe:
    raw = dict(raw)
    if isinstance(raw.get("config"), dict):
        raw["config"] = _config(raw["config"], origin)
    if raw.get("model_spec") and base_dir is not None:
        raw["model_spec"] = str((base_dir / raw["model_spec"]).resolve())
    try:
        recipe = Recipe(**raw)
    except ValidationError as err:
        field, rule = first_error(err)
        raise InputError(f"{origin}: {field}" if field else origin, rule) from None
    try:
        recipe.architecture  # a missing or bad spec file fails here, with its own message
        recipe.layout()
    except InputError as err:
        raise InputError(f"{origin}: {err.field}", err.rule) from None
    return recipe


def load_recipe(path: Path | str) -> Recipe:
    """A recipe file as users write them: its [config] keys must be fields ATTUNE knows (a typo
    would otherwise be shipped as written and never take effect)."""
    path = Path(path)
    raw = read_toml(path, "recipe file")
    if isinstance(raw.get("config"), dict):
        for key in _config(raw["config"], str(path)):
            check_config_key(key, f"{path}: config.{key}")
    return recipe_from_dict(raw, base_dir=path.parent, origin=str(path))


def recipe_to_dict(recipe: Recipe) -> dict[str, Any]:
    data = recipe.model_dump(exclude_none=True)
    data["cluster"] = recipe.cluster.model_dump(exclude_none=True)
    data["stack"] = recipe.stack.model_dump(exclude_none=True)
    if not data.get("search"):
        data.pop("search", None)   # a recipe without one dumps (and hashes) as before
    ordered = {k: data[k] for k in ("name", "model", "model_spec", "cluster", "stack", "torchtitan", "config",
                                    "search") if k in data}
    return ordered


def dump_recipe(recipe: Recipe) -> str:
    return tomli_w.dumps(recipe_to_dict(recipe))


def write_recipe(recipe: Recipe, path: Path | str) -> Path:
    """Write atomically (temp file then rename): a reader never sees half a recipe."""
    return atomic_write_text(path, dump_recipe(recipe))
