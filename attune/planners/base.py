"""The interface every planner implements, and what a planner is allowed to see.

A planner sees the baseline recipe, the lever space, the measured trials so far (levers, result,
diagnosis), the incumbent and the remaining budget. It never sees simulated ground truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from attune.levers import Scalar
from attune.recipe import Recipe
from attune.stacks.base import TrialResult


@dataclass(frozen=True)
class Observation:
    """One finished trial as a planner sees it."""
    levers: dict[str, Scalar]               # the full resolved lever assignment measured
    result: TrialResult
    diagnosis: list[str] = field(default_factory=list)   # symptom ids, e.g. "oom", "exposed_comm_fsdp"
    move: dict[str, Scalar] | None = None   # the lever(s) changed from the parent, when one-lever planning


@dataclass(frozen=True)
class PlannerView:
    recipe: Recipe                          # the baseline recipe (objective fields fixed)
    domains: dict[str, list[Scalar]]        # attune.space.lever_domains(recipe)
    history: list[Observation]
    incumbent: dict[str, Scalar]            # levers of the best verified-so-far layout
    incumbent_tps: float
    noise_band: float                       # relative gain a candidate must clear
    budget_left_gpu_hours: float
    trial_cost_gpu_hours: Any = None        # callable(levers) -> estimated GPU-hours of one trial
    affordable: Any = None                  # callable(levers) -> bool: the budget would let it start
                                            # (its cost plus the confirmation reserve); a planner that
                                            # proposes what is not affordable ends the search
    gate_probe: Any = None                  # callable(levers) -> bool: the whole gate (config check and
                                            # the proxy's convergence check) passes the layout; CPU only,
                                            # no GPU-hours, tens of seconds, cached by content
    probed: dict = field(default_factory=dict)   # the probes this campaign ran: layout key -> passed
    noise_rel_sd: float = 0.0               # run-to-run noise the baseline replicates measured (relative sd)
    settle_cost: Any = None                 # callable(levers) -> GPU-hours a win of this layout adds: the
                                            # confirmation runs and gate that would settle it, less the
                                            # incumbent's (all of them while the incumbent is the baseline)
    training_gpu_hours: float | None = None  # the training the tuned recipe will run (GPU-hours): what a gain
                                            # is worth; None: unknown, a trial is worth any expected gain
    prior: list[Observation] = field(default_factory=list)   # an earlier campaign's layouts, at this
                                            # campaign's scale (a warm start whose ranks held): data, not trials
    prior_sd: float = 0.0                   # the log sd each prior observation carries beyond run-to-run noise
    ledger: list = field(default_factory=list)   # earlier campaigns' measured moves (attune.lessons.ledger)
    context: Any = None                     # this campaign's ledger context (attune.lessons.ledger.Context)


@dataclass(frozen=True)
class Proposal:
    levers: dict[str, Scalar]               # the full lever assignment to measure next
    rationale: str = ""
    move: dict[str, Scalar] | None = None   # what changed vs the incumbent (one lever + compensation)
    lesson_id: str | None = None
    expected_gain: float | None = None
    transcript: str | None = None           # LLM planner: prompts and answers (an MLflow artifact)


class Planner(Protocol):
    name: str
    # A planner that plans from the lessons (attune, llm) sets reads_lessons = True: only its campaigns read
    # the store's lessons ledger at their start (one object per earlier campaign, a GET each on S3).

    def propose(self, view: PlannerView) -> Proposal | None:
        """The next trial, or None when the planner has nothing left worth measuring."""
        ...
