"""The gate's verdicts (pydantic): what the config check, the convergence check and verify return.

`GateReport.model_dump()` is exactly the JSON `attune gate --json` prints.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

Kind = Literal["config", "defect", "data", "invariant", "step1", "curve"]
Outcome = Literal["passed", "failed", "inconclusive"]


def _outcome(data: Any) -> Any:
    """Fill `verdict` from `passed` where it is not given; an old `passed: null` is inconclusive
    (and not passed)."""
    if isinstance(data, dict):
        data = dict(data)
        if data.get("passed") is None and "passed" in data:
            data["passed"] = False
            data.setdefault("verdict", "inconclusive")
        data.setdefault("verdict", "passed" if data.get("passed") else "failed")
    return data


def _agrees(model):
    """`passed` is the verdict "passed", nothing else (both fields are kept for older readers)."""
    if model.passed != (model.verdict == "passed"):
        raise ValueError(f"passed={model.passed} contradicts verdict={model.verdict!r}")
    return model


class Violation(BaseModel):
    """An objective-changing field whose effective value differs (or cannot be shown equal)."""
    model_config = ConfigDict(extra="forbid")
    field: str
    reason: str
    baseline: Any = None
    candidate: Any = None


class DefectHit(BaseModel):
    """A known-defects catalog entry that matches the candidate's stack and config."""
    model_config = ConfigDict(extra="forbid")
    id: str
    source: str
    component: str
    symptom: str
    matched: list[str] = []        # the version and config conditions that held
    unverified: list[str] = []     # versions the entry names that the recipe's stack does not carry
    range_note: str = ""


class NumericsChange(BaseModel):
    """A field that may change (speed lever) but changes numerics: it needs the convergence check."""
    model_config = ConfigDict(extra="forbid")
    field: str
    baseline: Any = None
    candidate: Any = None
    reason: str


class ConfigVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    passed: bool
    violations: list[Violation] = []
    defects: list[DefectHit] = []
    numerics_change: list[NumericsChange] = []
    speed_changes: list[str] = []          # speed-only fields that differ (allowed)
    tokens_per_step: dict[str, int] = {}   # effective, baseline and candidate


class Check(BaseModel):
    """One statistic against its calibrated tolerance."""
    model_config = ConfigDict(extra="forbid")
    name: str
    kind: Kind
    value: float | None = None
    tolerance: float | None = None
    passed: bool
    detail: str = ""

    @property
    def ratio(self) -> float:
        if self.value is None or not self.tolerance:
            return 0.0 if self.passed else float("inf")
        return abs(self.value) / self.tolerance


class ConvergenceVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    passed: bool                        # verdict == "passed"
    verdict: Outcome                    # inconclusive: inside the band but near its edge -> need_more_steps
    need_more_steps: int | None = None  # when inconclusive: the run length (last step) that would decide it
    reason: str
    mode: Literal["paired", "unpaired"]
    paired_with: list[str] = []
    pairing: Literal["batch_ids", "inferred", "none"] = "none"   # how paired_with was found
    pairing_evidence: dict[str, Any] = {}   # inferred: the correlations and the threshold (gate/pairing.py)
    tier: Literal["exact", "numerics"] = "exact"
    steps_used: int                     # steps every run logged (the comparison's length)
    last_step: int | None = None        # the last of them
    alignment: dict[str, Any] = {}      # runs of unequal length or with gaps: what each run logged
    replicates: int
    statistic: dict[str, Any] = {}      # the check closest to (or past) its tolerance
    band: dict[str, dict[str, list[float]]] = {}   # per metric: step, center, halfwidth
    fired: list[str] = []               # names of the checks that failed
    checks: list[Check] = []
    plot: str | None = None

    _fill = model_validator(mode="before")(_outcome)
    _consistent = model_validator(mode="after")(_agrees)


class GateReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    passed: bool                  # verdict == "passed": an inconclusive gate is not passed
    verdict: Outcome
    config: ConfigVerdict
    convergence: ConvergenceVerdict | None = None
    note: str = ""
    steps_used: int | None = None
    plot: str | None = None
    seconds: float | None = None
    trainer: str = "proxy"        # whose curves the convergence check read: proxy | torchtitan
    gpu_hours: float = 0.0        # what the gate's own runs held (the proxy runs on the CPU: 0)

    _fill = model_validator(mode="before")(_outcome)
    _consistent = model_validator(mode="after")(_agrees)
