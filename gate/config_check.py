"""The config check: the candidate may differ from the baseline only in speed-only fields.

Values are compared in effect, not as written: a field left unset takes its default, and the
global batch and sequence length come from the resolved layout, so a baseline with
global_batch_size = -1 (local x DP) and a candidate that writes the same number explicitly (the
compensation apply_levers forces) are equal. Tokens per step must match.
"""

from __future__ import annotations

import math

from attune.layout import GLOBAL_BATCH, SEQ_LEN
from attune.recipe import Recipe
import attune.gate.defects as defects
from attune.gate.fields import classify, effective, is_unset
from attune.gate.models import ConfigVerdict, NumericsChange, Violation

FLOAT8_REASON = "float8 on layers the baseline keeps in bf16: numerics change, needs the convergence check"
_VIA_LAYOUT = {GLOBAL_BATCH, SEQ_LEN}


def same(a: object, b: object) -> bool:
    """Equal in effect: 3e-4 == 0.0003, 1 == 1.0; bools and strings exactly."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def _shown(value: object) -> object:
    return None if is_unset(value) else value


def check_config(baseline: Recipe, candidate: Recipe) -> ConfigVerdict:
    violations: list[Violation] = []
    numerics: list[NumericsChange] = []
    speed: list[str] = []
    if baseline.architecture != candidate.architecture:
        violations.append(Violation(field="model", reason="a different model architecture",
                                    baseline=baseline.model_name, candidate=candidate.model_name))
    for field in sorted(set(baseline.config) | set(candidate.config)):
        if field in _VIA_LAYOUT:
            continue
        rule = classify(field)
        b, c = effective(baseline.config, field), effective(candidate.config, field)
        if is_unset(b) and is_unset(c):
            continue
        if is_unset(b) or is_unset(c):
            differs, why = True, f"{rule.reason}: set in one recipe only and its default is unknown"
        else:
            differs, why = not same(b, c), rule.reason
        if not differs:
            continue
        if rule.cls == "objective":
            violations.append(Violation(field=field, reason=why, baseline=_shown(b), candidate=_shown(c)))
        elif rule.cls == "numerics":
            numerics.append(NumericsChange(field=field, baseline=_shown(b), candidate=_shown(c),
                                           reason=FLOAT8_REASON if field == "quantize.float8" else why))
        else:
            speed.append(field)
    lb, lc = baseline.layout(), candidate.layout()
    if lb.global_batch != lc.global_batch:
        violations.append(Violation(field=GLOBAL_BATCH, baseline=lb.global_batch, candidate=lc.global_batch,
                                    reason="effective global batch (samples per optimizer step) differs"))
    if lb.seq_len != lc.seq_len:
        violations.append(Violation(field=SEQ_LEN, baseline=lb.seq_len, candidate=lc.seq_len,
                                    reason="sequence length differs"))
    if lb.tokens_per_step != lc.tokens_per_step:
        violations.append(Violation(field="tokens_per_step", baseline=lb.tokens_per_step,
                                    candidate=lc.tokens_per_step, reason="tokens per optimizer step differ"))
    for pkg in sorted(set(defects.stack_versions(baseline)) | set(defects.stack_versions(candidate))):
        b, c = defects.stack_versions(baseline).get(pkg), defects.stack_versions(candidate).get(pkg)
        if b != c:
            numerics.append(NumericsChange(field=f"stack.{pkg}", baseline=b, candidate=c,
                                           reason="another software version: kernels and numerics may differ"))
    for pkg in defects.bad_versions(candidate):
        violations.append(Violation(field=f"stack.{pkg}", candidate=defects.stack_versions(candidate)[pkg],
                                    reason="not a PEP 440 version: the defects catalog cannot be matched"))
    hits = defects.match(candidate)
    return ConfigVerdict(passed=not violations and not hits, violations=violations, defects=hits,
                         numerics_change=numerics, speed_changes=speed,
                         tokens_per_step={"baseline": lb.tokens_per_step, "candidate": lc.tokens_per_step})
