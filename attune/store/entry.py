"""One recipe-store entry: the best recipe known for a (model, cluster, stack), with what it measured.

The store keeps one entry per key; `rank` decides which of two entries for the same key is kept.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from attune.errors import InputError
from attune.levers import Scalar, speed_levers
from attune.spec import StackSpec, accelerator
from attune.spec.cluster import default_price
from attune.validation import name_rule

# Key segments become folder names and S3 key parts: keep them to characters that need no quoting.
# \Z, not $: `$` also matches before a trailing newline, and "model\n" must not pass.
SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def cost_per_million_tokens(accelerator_name: str, gpus: int, tokens_per_sec_per_gpu: float,
                            price_per_gpu_hour: float | None = None) -> float:
    """USD per 10^6 trained tokens: price per GPU-hour x GPUs / tokens per hour x 10^6.

    The price defaults to the accelerator's entry in attune/data/accelerators.toml ([prices]),
    which ATTUNE_PRICES=file overrides (see attune.spec.cluster.default_price).
    """
    if gpus <= 0:
        raise ValueError(f"gpus must be positive, got {gpus}")
    if tokens_per_sec_per_gpu <= 0:
        raise ValueError(f"tokens_per_sec_per_gpu must be positive, got {tokens_per_sec_per_gpu}")
    price = default_price(accelerator_name) if price_per_gpu_hour is None else float(price_per_gpu_hour)
    tokens_per_hour = tokens_per_sec_per_gpu * gpus * 3600.0
    return price * gpus / tokens_per_hour * 1e6


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


class StoreEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    accelerator: str
    gpus: int = Field(gt=0)
    gpus_per_node: int = Field(default=8, gt=0)
    stack: dict[str, str]
    stack_fingerprint: str = ""            # filled from `stack` when empty; a mismatch is refused
    recipe_toml: str
    levers: dict[str, Any] = {}  # lever key -> value as the recipe sets it
    tokens_per_sec_per_gpu: float = Field(gt=0)
    mfu: float | None = Field(default=None, ge=0, le=1)   # a fraction, like TrialResult.mfu
    step_time_s: float | None = Field(default=None, gt=0)
    peak_memory_gib: float | None = Field(default=None, ge=0)
    cost_per_million_tokens: float | None = Field(default=None, gt=0)  # filled from the price list
    gate_passed: bool
    gate_report: dict[str, Any] = {}
    mlflow_run_id: str | None = None
    simulated: bool
    measured_at: str = Field(default_factory=now_iso)
    campaign: dict[str, Any] | None = None  # gain, gpu_hours_used, ... as the campaign reports them

    @field_validator("model")
    @classmethod
    def _safe_model(cls, value: str) -> str:
        return name_rule(value, "model name")  # the rule ModelSpec.name follows: it names a folder / S3 key

    @field_validator("accelerator")
    @classmethod
    def _known_accelerator(cls, value: str) -> str:
        try:
            accelerator(value)
        except InputError as err:  # pydantic reports ValueErrors as field errors, not other types
            raise ValueError(err.rule) from None
        return value

    @field_validator("measured_at")
    @classmethod
    def _iso(cls, value: str) -> str:
        try:
            datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"measured_at must be an ISO 8601 timestamp, got {value!r}") from None
        return value

    @model_validator(mode="after")
    def _derived(self) -> "StoreEntry":
        # The fingerprint is part of the key: one computed here can never disagree with the stack.
        computed = _fingerprint(self.stack)
        if self.stack_fingerprint and self.stack_fingerprint != computed:
            raise ValueError(f"stack_fingerprint {self.stack_fingerprint!r} does not match the stack "
                             f"(its fingerprint is {computed!r})")
        object.__setattr__(self, "stack_fingerprint", computed)
        if self.cost_per_million_tokens is None:
            object.__setattr__(self, "cost_per_million_tokens", cost_per_million_tokens(
                self.accelerator, self.gpus, self.tokens_per_sec_per_gpu))
        return self

    @property
    def cluster_label(self) -> str:
        """Same form as ClusterSpec.label: "h100:8"."""
        return f"{self.accelerator}:{self.gpus}"

    @property
    def key(self) -> str:
        return entry_key(self.model, self.cluster_label, self.stack_fingerprint)


def _fingerprint(stack: dict[str, str]) -> str:
    return StackSpec(**stack).fingerprint()


def entry_key(model: str, cluster_label: str, stack_fingerprint: str) -> str:
    """Store key of an entry: recipes/<model>/<accelerator>x<gpus>/<stack fingerprint>/entry.json."""
    name, sep, count = cluster_label.partition(":")
    if not sep or not count.isdigit() or int(count) <= 0 or not SEGMENT.match(name):
        raise ValueError(f"cluster label must look like h100:8, got {cluster_label!r}")
    for what, value in (("model", model), ("stack fingerprint", stack_fingerprint)):
        if not SEGMENT.match(value):
            raise ValueError(f"{what} {value!r} must match {SEGMENT.pattern}")
    return f"recipes/{model}/{name}x{int(count)}/{stack_fingerprint}/entry.json"


def rank(entry: StoreEntry) -> tuple[bool, bool, float]:
    """Higher is better: verified beats unverified, a hardware measurement beats a simulated one
    (evidence over prediction), then throughput per GPU."""
    return (entry.gate_passed, not entry.simulated, entry.tokens_per_sec_per_gpu)


def better(candidate: StoreEntry, current: StoreEntry | None) -> bool:
    """True when `candidate` should replace `current`; a tie keeps what is stored (no rewrite)."""
    return current is None or rank(candidate) > rank(current)


def entry_for_recipe(recipe: Any, *, tokens_per_sec_per_gpu: float, gate_passed: bool, simulated: bool,
                     mfu: float | None = None, step_time_s: float | None = None,
                     peak_memory_gib: float | None = None, gate_report: dict[str, Any] | None = None,
                     mlflow_run_id: str | None = None, campaign: dict[str, Any] | None = None,
                     levers: dict[str, Scalar] | None = None, measured_at: str | None = None) -> StoreEntry:
    """A StoreEntry for an attune.recipe.Recipe: model, cluster, stack and TOML come from the recipe,
    levers default to the recipe's settings of the speed levers, the cost uses the cluster's price (its override
    in the recipe, else the price list)."""
    from attune.recipe import dump_recipe  # recipe imports specs; keep this module light to import

    cluster = recipe.cluster
    movable = set(speed_levers())  # what a tuner may move; objective settings are not levers here
    chosen = levers if levers is not None else {k: v for k, v in recipe.config.items() if k in movable}
    return StoreEntry(
        model=recipe.model_name, accelerator=cluster.accelerator, gpus=cluster.gpus,
        gpus_per_node=cluster.gpus_per_node, stack=recipe.stack.model_dump(exclude_none=True),
        recipe_toml=dump_recipe(recipe), levers=chosen, tokens_per_sec_per_gpu=tokens_per_sec_per_gpu,
        mfu=mfu, step_time_s=step_time_s, peak_memory_gib=peak_memory_gib,
        cost_per_million_tokens=cost_per_million_tokens(cluster.accelerator, cluster.gpus,
                                                        tokens_per_sec_per_gpu, cluster.price),
        gate_passed=gate_passed, gate_report=gate_report or {}, mlflow_run_id=mlflow_run_id,
        simulated=simulated, measured_at=measured_at or now_iso(), campaign=campaign)
