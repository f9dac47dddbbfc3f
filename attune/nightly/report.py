"""Markdown the Prefect UI shows: one summary per night, one artifact per standing regression."""

from __future__ import annotations

from attune.nightly.ledger import NightRecord


def regression_markdown(r: NightRecord) -> str:
    m, reg = r.remeasure, r.open_regression
    assert m is not None and reg is not None
    lines = [f"# Regression: {r.recipe} ({r.model} on {r.cluster})", "",
             f"**{_pct(m.change)}** tokens/s/GPU since the shipped recipe was measured "
             f"(noise band {m.band:.1%}), first seen {reg.since}.", "",
             "| | stack | tokens/s/GPU |", "| --- | --- | --- |",
             f"| shipped | `{m.reference_fingerprint}` | {m.reference_tps:,.0f} |",
             f"| tonight ({r.night}) | `{r.fingerprint}` {_stack(r.stack)} | "
             f"{_tps(m.mean_tps)} ({', '.join(f'{s:,.0f}' for s in m.samples) or ', '.join(m.statuses)}) |", ""]
    if r.changes:
        lines += ["What changed: " + "; ".join(r.changes), ""]
    if r.campaign:
        c = r.campaign
        lines += [f"Re-tune tonight: {c.get('stop_reason', '')}", "",
                  f"Campaign `{c.get('campaign_id')}`, {c.get('trials')} trials, "
                  f"{c.get('gpu_hours_used', 0):.1f} GPU-hours, MLflow run `{c.get('mlflow_run_id')}`.", ""]
    elif reg.retuned_night:
        lines += [f"A campaign on this stack ({reg.retuned_night}) found no faster gated recipe; no re-tune "
                  "runs until the stack or cluster changes.", ""]
    lines += ["No gated recipe faster than tonight's measurement exists: production keeps running "
              f"{_pct(m.change)} slower. Look at the campaign's trials in MLflow (experiment "
              "`attune-campaigns`) and at what changed in the stack."]
    return "\n".join(lines)


def summary_markdown(night: str, registry: str, records: list[NightRecord]) -> str:
    lines = [f"# ATTUNE nightly re-tune, {night}", "", f"Registry `{registry}`", "",
             "| recipe | cluster | stack | re-measured | action | result |", "| --- | --- | --- | --- | --- | --- |"]
    for r in records:
        m = r.remeasure
        measured = f"{_pct(m.change)} vs shipped" if m is not None and m.change is not None else "-"
        if r.error:
            result = f"ERROR: {r.error[:160]}"
        elif r.campaign:
            c = r.campaign
            result = (f"shipped {c.get('gain', 0):+.1%}" if c.get("shipped") else "kept the baseline")
        else:
            result = "-"
        if r.open_regression:
            result += f"; REGRESSION {_pct(r.open_regression.change)} standing since {r.open_regression.since}"
        lines.append(f"| {r.recipe} | {r.cluster} | `{r.fingerprint}` | {measured} | {r.action} | {result} |")
    lines += [""] + [f"- **{r.recipe}**: {r.why}" for r in records]
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _tps(x: float | None) -> str:
    return "did not run" if x is None else f"{x:,.0f}"


def _stack(stack: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in stack.items())
