"""One campaign's context: its settings (the one model the flow takes and the CLI's flags are built
from) and the Campaign object every step works on. A leaf of the campaign layer: it imports no other
campaign module, so the engine, the gate runs and the finish can all import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attune.campaign.budget import gpu_hours
from attune.campaign.costs import MeasuredRun, TrialCosts
from attune.campaign.state import CampaignState, Role
from attune.errors import InputError
from attune.levers import layout_key
from attune.recipe import Recipe
from attune.space import recipe_at
from attune.validation import first_error

MEASURE_TARGET_S = 120.0   # measured seconds a trial aims for, when its steps are slow
MIN_STEPS = 3


def _flag(name: str, **extra: Any) -> dict[str, Any]:
    """Field metadata: the command-line flag a setting has (attune.cli.common.add_settings_arguments)."""
    return {"flag": name} | extra


DEFAULT_TRAINING_HOURS = 168.0   # a week: what a gain is worth unless --training-hours says otherwise


class CampaignSettings(BaseModel):
    """What a campaign is asked to do. Validated once, here; a bad value is an InputError naming the flag."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # allow_inf_nan=False: `--budget-gpu-hours inf` would never stop a campaign and prints as Infinity in JSON
    budget_gpu_hours: float = Field(gt=0, allow_inf_nan=False, description="GPU-hours the campaign may charge, "
                                    "every trial and gate run included",
                                    json_schema_extra=_flag("--budget-gpu-hours", metavar="H"))
    stack: str = Field("sim", description="sim | torchtitan | measured (default sim: the simulated cluster; measured: "
                                   "real runs replayed from ATTUNE_MEASURED_TABLE)",
                       json_schema_extra=_flag("--stack"))
    planner: str = Field("attune", description="attune | random | bayes | bayes-warm | estimator-topk | "
                         "estimator-topk-naive | grid | llm", json_schema_extra=_flag("--planner"))
    # Upper bounds: a value past them is a typo, refused now rather than by the budget after a flow started
    seed: int = Field(0, ge=0, le=2**32 - 1, description="the campaign's seed (trial noise, sampling planners)",
                      json_schema_extra=_flag("--seed"))
    steps_per_trial: int = Field(10, ge=1, le=100_000, description="measured steps per trial (default 10)",
                                 json_schema_extra=_flag("--steps"))
    replicates: int = Field(3, ge=1, le=1_000, description="baseline and confirmation replicates (default 3)",
                            json_schema_extra=_flag("--replicates"))
    protocol: str = Field("budget", description="budget | fixed: fit baseline runs, confirmations and measured "
                          "steps to the budget (default budget: the fixed protocol where the budget pays it with "
                          "room to search), or always --replicates baseline and --replicates - 1 confirmation runs",
                          json_schema_extra=_flag("--protocol"))
    training_hours: float = Field(DEFAULT_TRAINING_HOURS, gt=0, allow_inf_nan=False,
                                  description="hours the tuned recipe will train on its cluster (default 168, a "
                                  "week): a trial is worth running while its expected gain over that training "
                                  "saves more GPU-hours than it costs", json_schema_extra=_flag("--training-hours",
                                                                                                metavar="H"))
    max_trials: int = Field(80, ge=1, le=100_000, description="search trials at most (default 80)",
                            json_schema_extra=_flag("--max-trials"))
    disabled_rules: tuple[str, ...] = Field((), description="switch a search rule of the attune planner off "
                                            "(repeatable; ablations), e.g. explore, lessons",
                                            json_schema_extra=_flag("--disable-rule", append=True, metavar="RULE"))
    gate_steps: int | None = Field(None, ge=2, le=100_000, description="steps of each convergence-check run "
                                   "(>= 2: a curve needs a slope): the proxy's on sim, torchtitan's on --stack "
                                   "torchtitan (default: the gate's, 40 and 20)",
                                   json_schema_extra=_flag("--gate-steps"))
    gate_seed: int | None = Field(None, ge=0, le=2**32 - 1,
                                  description="the gate's proxy seed (default: the campaign's seed)")
    warm_start: str | None = Field(None, description="start from an earlier campaign of the same model: its id, "
                                   "its folder, or auto (the latest finished campaign of this recipe name): its "
                                   "best layouts are re-measured and, where their ranks hold, its trials are the "
                                   "planner's prior data", json_schema_extra=_flag("--warm-start", metavar="CAMPAIGN"))
    stack_options: dict[str, Any] = Field(default_factory=dict, description="the stack's own options "
                                          "(the simulated cluster on sim)")
    planner_options: dict[str, Any] = Field(default_factory=dict, description="the planner's own options "
                                            "(the endpoint of the llm planner)")

    @field_validator("stack")
    @classmethod
    def _known_stack(cls, value: str) -> str:
        from attune.stacks.registry import STACKS
        if value not in STACKS:
            raise ValueError(f"unknown stack {value!r}; choose from {', '.join(STACKS)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _measured_table(cls, values: Any) -> Any:
        """On the measured stack, the table replayed (resolved from ATTUNE_MEASURED_TABLE where no
        option names it) and its digest are stack options, so they are part of the identity."""
        if isinstance(values, dict) and values.get("stack") == "measured":
            from attune.stacks.measured import table_options
            values = dict(values) | {"stack_options": table_options(dict(values.get("stack_options") or {}))}
        return values

    @field_validator("protocol")
    @classmethod
    def _known_protocol(cls, value: str) -> str:
        if value not in ("budget", "fixed"):
            raise ValueError(f"unknown protocol {value!r}; choose from budget, fixed")
        return value

    @field_validator("planner")
    @classmethod
    def _known_planner(cls, value: str) -> str:
        from attune.planners.registry import planner_names
        if value not in planner_names():
            raise ValueError(f"unknown planner {value!r}; choose from {', '.join(planner_names())}")
        return value

    @field_validator("disabled_rules")
    @classmethod
    def _known_rules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from attune.planners.attune_planner import RULES
        unknown = sorted(set(value) - set(RULES))
        if unknown:
            raise ValueError(f"unknown rule(s) {', '.join(unknown)}; rules: {', '.join(RULES)}")
        return tuple(value)

    @classmethod
    def of(cls, **values: Any) -> "CampaignSettings":
        """The settings, or an InputError naming the flag of the first bad one."""
        try:
            return cls(**values)
        except ValidationError as err:
            name, rule = first_error(err)
            info = cls.model_fields.get(name.split(".")[0])
            flag = ((info.json_schema_extra or {}).get("flag") if info else None) or name
            given = err.errors()[0].get("input")
            if not isinstance(given, (dict, list, tuple)) and repr(given) not in rule:
                rule = f"{rule}, got {given!r}"
            raise InputError(flag, rule) from None

    def identity(self) -> dict[str, Any]:
        """What makes two runs the same campaign (a re-run with these resumes)."""
        return {"budget": self.budget_gpu_hours, "stack": self.stack, "planner": self.planner, "seed": self.seed,
                "steps": self.steps_per_trial, "replicates": self.replicates, "disabled": sorted(self.disabled_rules),
                "stack_options": self.stack_options,
                **({"protocol": self.protocol} if self.protocol != "budget" else {}),
                **({"training_hours": self.training_hours} if self.training_hours != DEFAULT_TRAINING_HOURS else {}),
                **({"gate_seed": self.gate_seed} if self.gate_seed is not None else {}),
                **({"warm_start": self.warm_start} if self.warm_start else {})}


@dataclass
class Campaign:
    """The recipe, its settings and persisted state, and the stack and planner working on them."""

    recipe: Recipe
    settings: CampaignSettings
    state: CampaignState
    directory: Path
    stack: Any
    planner: Any
    attempts: int = 0                       # attempts of the trial in flight (retries included)
    quiet: bool = False                     # no progress lines
    say: Callable[[str], None] | None = None   # a progress line (the flow sets it)
    gpu_pool: str | None = None             # tag of the trial tasks: gpu-pool:<name> (concurrency limits)
    lock: Any = None                        # the open lock file that keeps other processes out (engine)
    ledger: list = field(default_factory=list)   # the lessons ledger as it was when the campaign started
                                            # (attune.campaign.lessons_ledger)
    _costs: dict[tuple, float] = field(default_factory=dict, repr=False)
    _trial_costs: TrialCosts | None = field(default=None, repr=False)
    _full_steps: dict[tuple, int] = field(default_factory=dict, repr=False)
    _trials_learned: int = field(default=-1, repr=False)

    @property
    def state_path(self) -> Path:
        return self.directory / "state.json"

    def save(self) -> None:
        self.state.save(self.state_path)

    def training_gpu_hours(self) -> float:
        """The GPU-hours of training the tuned recipe will run: what a gain is worth."""
        return self.settings.training_hours * self.recipe.cluster.gpus

    def trial_recipe(self, levers: dict[str, Any], role: Role = "trial") -> Recipe:
        return recipe_at(self.recipe, levers, name=f"{self.recipe.name}-{role}")

    def trial_steps(self, levers: dict[str, Any], role: Role = "trial") -> int:
        """Measured steps of one run in this role: the protocol's screening steps for baseline and search
        runs where it fitted itself to a small budget (attune.campaign.protocol), else full_steps."""
        full = self.full_steps(levers)
        protocol = self.state.protocol if self.state is not None else None
        if protocol is not None and protocol.screen_steps is not None and role != "confirm":
            return min(full, protocol.screen_steps)
        return full

    def full_steps(self, levers: dict[str, Any]) -> int:
        """Measured steps of one trial: steps_per_trial, fewer when steps are so slow that
        MEASURE_TARGET_S is covered sooner (at least MIN_STEPS). A 2-minute step measures as well
        over 3 steps as over 10, and a budget of 40 GPU-hours per 64 GPUs could not pay for more."""
        from attune.planners.estimates import predict  # the public estimator: never the ground truth
        key = layout_key(levers)
        if key not in self._full_steps:   # pure in the levers; planners ask about thousands of layouts
            try:
                step_s = predict(self.recipe, self.trial_recipe(levers).layout()).step_time_s
            except Exception:  # noqa: BLE001 - no estimate: measure the configured number of steps
                self._full_steps[key] = self.settings.steps_per_trial
            else:
                wanted = math.ceil(MEASURE_TARGET_S / max(step_s, 1e-6))
                self._full_steps[key] = max(min(MIN_STEPS, self.settings.steps_per_trial),
                                            min(self.settings.steps_per_trial, wanted))
        return self._full_steps[key]

    def estimated_cost(self, levers: dict[str, Any], role: Role = "trial") -> float:
        """GPU-hours one run of these levers in this role is expected to cost: the stack's estimate
        corrected by what this campaign's runs measured (attune.campaign.costs; memoised until the
        next run: planners ask about the same layouts many times)."""
        steps = self.trial_steps(levers, role)
        costs = self.trial_costs()
        key = (layout_key(levers), steps, len(costs.runs_seen))
        if key not in self._costs:
            if len(self._costs) > 50_000:
                self._costs.clear()
            self._costs[key] = gpu_hours(self.recipe.cluster.gpus, costs.wall_time_s(self.trial_recipe(levers), steps))
        return self._costs[key]

    def run_wall_time_s(self, recipe: Recipe, steps: int) -> float:
        """Seconds a run of this recipe (the campaign's, moved to some layout) is expected to take."""
        return self.trial_costs().wall_time_s(recipe, steps)

    def trial_costs(self) -> TrialCosts:
        """The cost model, having learned from every successful run in the state."""
        if self._trial_costs is None:
            self._trial_costs = TrialCosts(prior=self.stack.estimate_wall_time_s, recipe=self.recipe)
        seen = 0 if self.state is None else len(self.state.trials)
        if seen == self._trials_learned:   # trials are only appended; planners ask this thousands of times a run
            return self._trial_costs
        self._trials_learned = seen
        runs = [] if self.state is None else [
            MeasuredRun(levers=t.levers, steps=(t.steps or self.trial_steps(t.levers, t.role)) if t.result.ok else 0,
                        wall_time_s=t.result.wall_time_s, step_time_s=(t.result.step_time_s or 0.0) if t.result.ok else 0.0)
            for t in self.state.trials if t.result.ok or t.result.status.value == "oom"]
        self._trial_costs.learn(runs, [] if self.state is None or self.state.warm is None else self.state.warm.runs)
        return self._trial_costs
