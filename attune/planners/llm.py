"""`--planner llm`: a language model proposes the next move, held inside the lever schema.

Any OpenAI-compatible endpoint (vLLM, llama.cpp server, hosted APIs) through the `openai` client.
Each turn sends a compact context (recipe, lever catalog with valid values, trial history with
diagnoses, matching lessons, budget left) and asks for one structured move (JSON schema from the
pydantic model LlmMove). An answer outside the schema or the lever's valid values is refused and
re-asked once; then the rule-based planner takes that turn, so the campaign never stalls.
Nothing the model says reaches a shell, a path or a config field: only a validated (lever, value)
pair from the catalog becomes a move; its text is kept as evidence only. The API key comes from
OPENAI_API_KEY and is never logged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attune.errors import InputError
from attune.layout import apply_levers, resolve_layout
from attune.levers import Scalar, speed_levers
from attune.planners.base import PlannerView, Proposal
from attune.planners.attune_planner import AttunePlanner
from attune.planners.registry import register_planner
from attune.recipe import dump_recipe
from attune.space import config_for, layout_of
from attune.lessons.catalog import match
from attune.lessons.posterior import posterior

SYSTEM = ("You tune distributed LLM training recipes for throughput. Propose exactly ONE lever change "
          "from the catalog given, as JSON matching the schema. Only catalog levers and listed values are valid. "
          "Never repeat a layout that was already measured.")


class LlmMove(BaseModel):
    model_config = ConfigDict(extra="forbid")   # the schema says additionalProperties: false
    lever: str = Field(description="one lever key from the catalog")
    value: int | bool | str = Field(description="one of the lever's valid values")
    expected_effect: str = Field(max_length=400, description="what the change should do to throughput/memory")
    rationale: str = Field(max_length=1200, description="why, from the diagnosis and lessons")


class RefusedAnswer(Exception):
    pass


@dataclass
class LlmPlanner:
    name: str = "llm"
    reads_lessons: ClassVar[bool] = True
    base_url: str | None = None
    model: str | None = None
    timeout_s: float = 60.0
    seed: int = 0
    fallback: AttunePlanner = field(default_factory=AttunePlanner)
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0,
                                                           "calls": 0, "refused": 0, "fallback_turns": 0})
    stop_reason: str = ""

    def __post_init__(self):
        if not self.base_url:
            raise InputError("--llm-base-url", "required with --planner llm (an OpenAI-compatible endpoint)")
        from openai import OpenAI
        self.model = self.model or os.environ.get("ATTUNE_LLM_MODEL", "default")
        self._client = OpenAI(base_url=self.base_url, api_key=os.environ.get("OPENAI_API_KEY") or "not-needed",
                              timeout=self.timeout_s, max_retries=0)

    # ------------------------------------------------------------------------------------------
    def propose(self, view: PlannerView) -> Proposal | None:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self._context(view)}]
        transcript: list[dict[str, Any]] = []
        for attempt in range(2):   # one answer, one re-ask
            try:
                answer, text = self._ask(messages)
                transcript.append({"attempt": attempt, "answer": text})
                proposal = self._validated(view, answer)
                return Proposal(levers=proposal[0], move=proposal[1], lesson_id=None,
                                rationale=f"llm: {answer.rationale[:300]}",
                                transcript=json.dumps({"messages": messages, "turns": transcript}, indent=1))
            except RefusedAnswer as refusal:
                self.usage["refused"] += 1
                transcript.append({"attempt": attempt, "refused": str(refusal)})
                messages = messages + [{"role": "assistant", "content": transcript[-1].get("answer", "")},
                                       {"role": "user", "content": f"Refused: {refusal}. Answer again with one "
                                                                   f"valid move as JSON."}]
        self.usage["fallback_turns"] += 1
        proposal = self.fallback.propose(view)
        if proposal is None:
            self.stop_reason = self.fallback.stop_reason
            return None
        return Proposal(levers=proposal.levers, move=proposal.move, lesson_id=proposal.lesson_id,
                        expected_gain=proposal.expected_gain,
                        rationale=f"rule-based fallback after refused LLM answers: {proposal.rationale}",
                        transcript=json.dumps({"messages": messages, "turns": transcript}, indent=1))

    def _ask(self, messages: list[dict[str, str]]) -> tuple[LlmMove, str]:
        schema = {"name": "lever_move", "schema": LlmMove.model_json_schema(), "strict": True}
        try:
            response = self._client.chat.completions.create(
                model=self.model, messages=messages, temperature=0,
                response_format={"type": "json_schema", "json_schema": schema})
        except Exception as err:  # timeouts, HTTP errors, connection refused: a refused turn
            raise RefusedAnswer(f"endpoint error: {type(err).__name__}") from None
        self.usage["calls"] += 1
        if response.usage is not None:
            self.usage["prompt_tokens"] += response.usage.prompt_tokens or 0
            self.usage["completion_tokens"] += response.usage.completion_tokens or 0
        text = (response.choices[0].message.content or "") if response.choices else ""
        try:
            return LlmMove.model_validate_json(text), text
        except ValidationError as err:
            raise RefusedAnswer(f"answer is not a valid move object ({err.errors()[0]['msg']})") from None

    def _validated(self, view: PlannerView, answer: LlmMove) -> tuple[dict[str, Scalar], dict[str, Scalar]]:
        if answer.lever not in speed_levers() or answer.lever not in view.domains:
            raise RefusedAnswer(f"{answer.lever!r} is not a lever of the catalog")
        if answer.value not in view.domains[answer.lever] or type(answer.value) is not type(view.domains[answer.lever][0]):
            raise RefusedAnswer(f"{answer.value!r} is not a valid value of {answer.lever}: "
                                f"{view.domains[answer.lever]}")
        recipe = view.recipe
        try:
            config = apply_levers(config_for(recipe, view.incumbent), {answer.lever: answer.value},
                                  recipe.architecture, recipe.cluster)
            layout = resolve_layout(config, recipe.architecture, recipe.cluster)
        except InputError as err:
            raise RefusedAnswer(f"the move breaks a layout rule: {err}") from None
        if layout.levers() in [obs.levers for obs in view.history]:
            raise RefusedAnswer("that layout was already measured")
        return layout.levers(), {answer.lever: answer.value}

    def _context(self, view: PlannerView) -> str:
        recipe = view.recipe
        base = view.history[0].levers if view.history else view.incumbent
        history = [{"changed_vs_baseline": {k: v for k, v in obs.levers.items() if base.get(k) != v},
                    "status": obs.result.status.value, "tokens_per_sec_per_gpu": obs.result.tokens_per_sec_per_gpu,
                    "mfu": obs.result.mfu, "peak_memory_gib": obs.result.peak_memory_gib,
                    "diagnosis": obs.diagnosis} for obs in view.history]
        incumbent = layout_of(recipe, view.incumbent)
        symptoms = {s for obs in view.history if obs.levers == view.incumbent for s in obs.diagnosis}
        lessons = []
        for ls in match(self.fallback.lessons, symptoms, recipe.architecture.is_moe, incumbent)[:8]:
            belief = posterior(ls, view.ledger, view.context)
            lessons.append({"id": ls.id, "title": ls.title, "try": ls.try_.model_dump(),
                            "prior_gain": round(belief.gain, 3), "evidence": belief.text()})
        return json.dumps({"recipe": dump_recipe(recipe), "levers": view.domains, "incumbent": view.incumbent,
                           "incumbent_tokens_per_sec_per_gpu": view.incumbent_tps, "history": history,
                           "matching_lessons": lessons, "noise_band": view.noise_band,
                           "budget_left_gpu_hours": round(view.budget_left_gpu_hours, 2)}, default=str)


register_planner("llm", lambda seed=0, base_url=None, model=None, timeout_s=60.0, **_: LlmPlanner(
    base_url=base_url, model=model, timeout_s=timeout_s, seed=seed))
