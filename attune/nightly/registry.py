"""The registry of production recipes the nightly job watches (a TOML file, e.g. deployments/production.toml).

    [defaults]                       # optional: applied to every [[recipe]] that does not set the key
    budget_gpu_hours = 40
    [[recipe]]
    name = "llama3-8b-h100"          # unique; names the ledger entries and artifacts
    path = "../recipes/public/llama3_8b.toml"   # relative to the registry file
    cluster = "h100:8"               # optional: the production cluster, when not the recipe's own

Top-level `store` and `mlflow_uri` say where shipped recipes and runs go (default: ATTUNE_STORE /
MLFLOW_TRACKING_URI, else under ATTUNE_HOME).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attune.data_files import read_toml
from attune.errors import InputError
from attune.store.entry import SEGMENT
from attune.validation import first_error


class RegisteredRecipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    path: str
    budget_gpu_hours: float = Field(gt=0)       # per night: the re-measure and the campaign together
    cluster: str | None = None                  # ACCEL:COUNT, as `attune tune --cluster`
    stack: Literal["sim", "torchtitan"] = "sim"
    stack_options: dict[str, Any] = {}          # passed to the stack as they are
    gpu_pool: str | None = None                 # the GPU pool its trials use (default: the stack's name)
    probe_deployment: str | None = None         # torchtitan: read versions on the GPU pool ("flow/deployment")
    planner: str = "attune"
    planner_options: dict[str, Any] = {}
    seed: int = 0
    replicates: int = Field(default=3, ge=2)    # re-measure and campaign replicates (2+ to see the noise)
    steps_per_trial: int = Field(default=10, ge=1)
    gate_steps: int | None = None
    regression_floor: float = Field(default=0.02, ge=0, lt=1)  # slowdowns below this are never regressions
    confidence: float = Field(default=0.95, gt=0.5, lt=1)      # of the regression call
    remeasure: Literal["always", "on_change", "never"] = "always"
    warm_start: bool = True                     # each night's campaign starts from the last finished one
    enabled: bool = True

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not SEGMENT.match(value):
            raise ValueError(f"{value!r} must match {SEGMENT.pattern} (it names store keys and artifacts)")
        return value

    @property
    def pool(self) -> str:
        """The GPU pool its trials use: the tag gpu-pool:<pool> that the concurrency limit counts."""
        return self.gpu_pool or self.stack


class Registry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    store: str | None = None
    mlflow_uri: str | None = None
    recipes: list[RegisteredRecipe]

    @model_validator(mode="after")
    def _unique(self) -> "Registry":
        names = [r.name for r in self.recipes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"recipe names must be unique, repeated: {', '.join(twice)}")
        return self

    def selected(self, only: list[str] | None = None) -> list[RegisteredRecipe]:
        if only:
            unknown = sorted(set(only) - {r.name for r in self.recipes})
            if unknown:
                raise InputError("only", f"not in {self.path}: {', '.join(unknown)}")
            return [r for r in self.recipes if r.name in only]
        return [r for r in self.recipes if r.enabled]


def load_registry(path: Path | str) -> Registry:
    path = Path(path).resolve()
    raw = read_toml(path)
    defaults = raw.pop("defaults", {})
    recipes = raw.pop("recipe", [])
    if not isinstance(recipes, list) or not recipes:
        raise InputError(str(path), "needs at least one [[recipe]] table")
    rows = []
    for row in recipes:
        row = dict(defaults) | dict(row)
        if "path" in row:  # relative to the registry file, so the registry travels with its recipes
            row["path"] = str((path.parent / row["path"]).resolve())
        rows.append(row)
    try:
        registry = Registry(path=str(path), recipes=rows, **raw)
    except ValidationError as err:
        field, rule = first_error(err)
        raise InputError(f"{path}: {field}", rule) from None
    for r in registry.recipes:
        if not Path(r.path).is_file():
            raise InputError(f"{path}: recipe {r.name}", f"recipe file not found: {r.path}")
    return registry
