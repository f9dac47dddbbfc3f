"""Diagnose one trial from what it measured: which symptoms it shows, with the evidence for each.

Symptom ids and thresholds live in lessons/symptoms.toml; the lessons catalog matches on the ids.
Works from the sim stack's profiler-style breakdown and from what torchtitan's logs show (status,
memory); symptoms whose evidence a stack does not report are simply not raised.
"""

from __future__ import annotations

import functools
import tomllib

from pydantic import BaseModel

from attune.layout import Layout
from attune.stacks.base import TrialResult, TrialStatus
from attune.lessons.catalog import HERE as LESSONS_DIR

SYMPTOMS_FILE = LESSONS_DIR / "symptoms.toml"


@functools.cache
def symptom_table() -> dict:
    return tomllib.loads(SYMPTOMS_FILE.read_text())


class Symptom(BaseModel):
    id: str
    evidence: str


def diagnose(result: TrialResult, layout: Layout, gpus_per_node: int, hbm_gib: float) -> list[Symptom]:
    th = symptom_table()["thresholds"]
    out: list[Symptom] = []
    if result.status == TrialStatus.OOM:
        return [Symptom(id="oom", evidence=result.message or "out of memory")]
    if result.status != TrialStatus.OK:
        kind = "known_defect" if "defect" in result.message.lower() else result.status.value
        return [Symptom(id=kind, evidence=result.message[-300:])]
    step = result.step_time_s or 0.0
    breakdown = result.breakdown or {}
    if step > 0:
        for kind, seconds in (breakdown.get("exposed_comm_s") or {}).items():
            if seconds / step > th["exposed_comm_share"]:
                out.append(Symptom(id=f"exposed_comm_{kind}", evidence=f"{kind} exposed {seconds / step:.0%} of the step"))
        bubble = breakdown.get("bubble_s", 0.0)
        if bubble / step > th["bubble_share"]:
            out.append(Symptom(id="pipeline_bubble", evidence=f"bubble {bubble / step:.0%} of the step"))
        recompute = breakdown.get("recompute_s", 0.0)
        if recompute / step > th["recompute_share"]:
            out.append(Symptom(id="recompute_overhead", evidence=f"recompute {recompute / step:.0%} of the step"))
    if result.mfu is not None and result.mfu < th["low_mfu"]:
        out.append(Symptom(id="low_mfu", evidence=f"MFU {result.mfu:.0%}"))
    if result.peak_memory_gib is not None and hbm_gib > 0:
        share = result.peak_memory_gib / hbm_gib
        if share < th["memory_headroom"]:
            out.append(Symptom(id="memory_headroom", evidence=f"peak {result.peak_memory_gib:.1f} of {hbm_gib:.0f} GiB"))
        elif share > th["memory_tight"]:
            out.append(Symptom(id="memory_tight", evidence=f"peak {result.peak_memory_gib:.1f} of {hbm_gib:.0f} GiB"))
    if layout.tp > gpus_per_node:
        out.append(Symptom(id="tp_across_nodes", evidence=f"tp={layout.tp} > {gpus_per_node} GPUs per node"))
    return out
