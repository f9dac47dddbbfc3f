"""Step-1 checks: the candidate's first step on the fixed probe batch against the replicates'.

Adam normalises updates per parameter, so a fault that scales gradients by a constant barely
moves the loss curve (gate-study.md, finding 1); the step-1 record shows it exactly. Every
quantity's tolerance is calibrated from the replicates: max(M x the largest leave-one-out
deviation of a replicate, floor). The floors are the metric's precision, per numerics tier
(exact: same math up to reduction order; numerics: float8 and the like, where the gradient
itself legitimately differs and the sketch comparison is skipped).
"""

from __future__ import annotations

import math

import numpy as np

from attune.gate.models import Check

M = 3.0
# name: (how the deviation is measured, floor in the exact tier, floor in the numerics tier)
SCALARS = {"forward_loss": ("rel", 1e-5, 2e-2), "eval_after_update": ("rel", 1e-4, 2e-2),
           "grad_norm": ("log", 1e-3, 1e-1), "update_norm": ("log", 1e-3, 1e-1),
           "lr": ("rel", 1e-9, 1e-9), "valid_tokens": ("rel", 0.0, 0.0), "dropped_tokens": ("abs", 0.0, 0.0)}
GROUPED = {"group_grad_norms": ("log", 1e-3, 1e-1), "group_update_norms": ("log", 1e-3, 1e-1)}
SKETCH_FLOOR = 1e-4
LOAD_FLOOR = (2e-3, 3e-2)
CLIP_RTOL = 1e-3


def _dev(kind: str, value: float, ref: float) -> float:
    if kind == "log":
        return math.log(max(value, 1e-30) / max(ref, 1e-30))
    if kind == "rel":
        return (value - ref) / max(abs(ref), 1e-30)
    return value - ref


def _calibrated(kind: str, cand: float, reps: list[float], floor: float) -> tuple[float, float]:
    """(candidate's deviation from the replicates' mean, tolerance)."""
    ref = float(np.mean(reps))
    loo = [abs(_dev(kind, r, float(np.mean(reps[:i] + reps[i + 1:])))) for i, r in enumerate(reps)]
    return _dev(kind, cand, ref), max(M * max(loo), floor)


def _vector_error(vec: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(vec - ref) / max(np.linalg.norm(ref), 1e-30))


def step1_checks(candidate: dict, baselines: list[dict], tier: str) -> list[Check]:
    """Checks of one candidate step-1 record against >= 2 replicate records."""
    col = 1 if tier == "exact" else 2
    checks: list[Check] = []

    def add(name: str, kind: str, cand, reps, floor) -> None:
        if cand is None or any(r is None for r in reps):
            return
        value, tol = _calibrated(kind, float(cand), [float(r) for r in reps], floor)
        ok = abs(value) <= tol if tol > 0 else value == 0
        checks.append(Check(name=f"step1.{name}", kind="step1", value=value, tolerance=tol, passed=ok,
                            detail=f"candidate {float(cand):.6g} vs replicates {np.mean(reps):.6g}"))

    for name, spec in SCALARS.items():
        add(name, spec[0], candidate.get(name), [b.get(name) for b in baselines], spec[col])
    for key, spec in GROUPED.items():
        groups = sorted(set(candidate.get(key, {})) | set().union(*(b.get(key, {}) for b in baselines)))
        for g in groups:
            add(f"{key}.{g}", spec[0], candidate.get(key, {}).get(g, 0.0),
                [b.get(key, {}).get(g, 0.0) for b in baselines], spec[col])
    load = candidate.get("expert_load")
    if load and all(b.get("expert_load") for b in baselines):
        reps = [np.asarray(b["expert_load"], float) for b in baselines]
        ref = np.mean(reps, 0)
        loo = [np.abs(r - np.mean(reps[:i] + reps[i + 1:], 0)).sum() for i, r in enumerate(reps)]
        value, tol = float(np.abs(np.asarray(load, float) - ref).sum()), max(M * max(loo), LOAD_FLOOR[col - 1])
        checks.append(Check(name="step1.expert_load", kind="step1", value=value, tolerance=tol, passed=value <= tol,
                            detail="L1 distance of tokens-per-expert fractions"))
    if tier == "exact" and candidate.get("grad_sketch") and all(b.get("grad_sketch") for b in baselines):
        for g in sorted(candidate["grad_sketch"]):
            reps = [np.asarray(b["grad_sketch"].get(g, []), float) for b in baselines]
            if any(r.size != len(candidate["grad_sketch"][g]) for r in reps):
                continue
            ref = np.mean(reps, 0)
            loo = [_vector_error(r, np.mean(reps[:i] + reps[i + 1:], 0)) for i, r in enumerate(reps)]
            value = _vector_error(np.asarray(candidate["grad_sketch"][g], float), ref)
            tol = max(M * max(loo), SKETCH_FLOOR)
            checks.append(Check(name=f"step1.grad_sketch.{g}", kind="step1", value=value, tolerance=tol,
                                passed=value <= tol, detail="relative error of a random projection of the gradient"))
    checks += invariant_checks(candidate)
    return checks


def invariant_checks(record: dict) -> list[Check]:
    """Checks that need no baseline: after clipping, the global norm is min(max_norm, pre-clip norm);
    a recompute under activation checkpointing routes every token as the forward did."""
    out = []
    pre, post, max_norm = record.get("grad_norm"), record.get("post_clip_norm"), record.get("max_norm")
    if pre is not None and post is not None and max_norm:
        expect = min(float(max_norm), float(pre))
        value = (float(post) - expect) / expect
        out.append(Check(name="invariant.post_clip_norm", kind="invariant", value=value, tolerance=CLIP_RTOL,
                         passed=abs(value) <= CLIP_RTOL,
                         detail=f"post-clip norm {float(post):.6g}, expected min(max_norm, pre-clip) = {expect:.6g}"))
    mismatch = record.get("recompute_mismatch")
    if mismatch is not None:
        out.append(Check(name="invariant.recompute_routing", kind="invariant", value=float(mismatch), tolerance=0.0,
                         passed=mismatch == 0, detail=f"{mismatch} token(s) routed differently by the recompute"))
    return out
