"""Re-tune tonight or not, and why, in words (the flow shows these strings as they are).

Re-tune when the stack or the cluster differ from the last tuned one, or when the shipped recipe is
measurably slower than it shipped and no campaign has yet tried to fix that on this stack.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from attune.nightly.fingerprint import stack_changes
from attune.nightly.ledger import NightRecord, OpenRegression
from attune.nightly.regression import Remeasure
from attune.store import StoreEntry


class Reference(BaseModel):
    """The stack the recipe was last tuned on: the last shipped entry, or a later campaign that
    kept the baseline (from the ledger)."""
    fingerprint: str
    stack: dict[str, str]
    cluster: str
    source: Literal["store", "ledger"]
    at: str


def reference(shipped: StoreEntry | None, last: NightRecord | None, cluster: str) -> Reference | None:
    found = []
    if shipped is not None:
        found.append(Reference(fingerprint=shipped.stack_fingerprint, stack=shipped.stack,
                               cluster=shipped.cluster_label, source="store", at=shipped.measured_at))
    if last is not None and last.tuned_fingerprint and last.tuned_at and last.cluster == cluster:
        found.append(Reference(fingerprint=last.tuned_fingerprint, stack=last.tuned_stack or {}, cluster=cluster,
                               source="ledger", at=last.tuned_at))
    return max(found, key=lambda r: datetime.fromisoformat(r.at)) if found else None


def changes(ref: Reference | None, fingerprint: str, stack: dict[str, str], model: str, cluster: str,
            other_clusters: list[str]) -> list[str]:
    if ref is None:
        others = [c for c in other_clusters if c != cluster]
        if others:
            return [f"cluster changed: {model} was shipped for {', '.join(others)}, production is now {cluster}"]
        return [f"no shipped recipe for {model} on {cluster} yet"]
    if ref.fingerprint != fingerprint:
        what = "; ".join(stack_changes(ref.stack, stack)) or "versions differ"
        return [f"stack changed ({ref.fingerprint} -> {fingerprint}): {what}"]
    return []


def decide(found: list[str], remeasure: Remeasure | None, last: NightRecord | None,
           fingerprint: str) -> tuple[bool, str]:
    if found:
        return True, "; ".join(found)
    if remeasure is not None and remeasure.regressed:
        standing = last.open_regression if last is not None else None
        if standing is not None and standing.fingerprint == fingerprint and standing.retuned_night:
            return False, (f"still regressed since {standing.since}: {remeasure.why}; a campaign on this stack "
                           f"({standing.retuned_night}) found nothing faster, so none runs until the stack or "
                           f"cluster changes")
        return True, f"regression: {remeasure.why}"
    why = "stack and cluster unchanged since the last tuned recipe"
    return False, why + (f"; {remeasure.why}" if remeasure is not None else "")


def open_regression(remeasure: Remeasure | None, shipped_faster: bool, last: NightRecord | None,
                    fingerprint: str, night: str, tuned: bool) -> OpenRegression | None:
    """The regression still standing after tonight, if any (None when there was none or a gated
    recipe faster than tonight's measurement shipped)."""
    if remeasure is None or not remeasure.regressed or shipped_faster:
        return None
    standing = last.open_regression if last is not None else None
    same = standing is not None and standing.fingerprint == fingerprint
    return OpenRegression(since=standing.since if same else night, fingerprint=fingerprint,
                          change=remeasure.change if remeasure.change is not None else -1.0,
                          retuned_night=night if tuned else (standing.retuned_night if same else None))
