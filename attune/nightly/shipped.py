"""The last shipped recipe for a model on a cluster, from the recipe store.

The store keeps one entry per (model, cluster, stack fingerprint); the last shipped recipe is the
newest of them for the model and cluster (by measured_at), whatever its stack.
"""

from __future__ import annotations

from datetime import datetime

from attune.store import RecipeStore, StoreEntry


def last_shipped(store: RecipeStore, model: str, cluster_label: str) -> StoreEntry | None:
    rows = [row for row in store.index()["entries"].values()
            if row.get("model") == model and f"{row.get('accelerator')}:{row.get('gpus')}" == cluster_label
            and row.get("gate_passed")]
    if not rows:
        return None
    newest = max(rows, key=lambda row: datetime.fromisoformat(row["measured_at"]))
    return store.get(model, cluster_label, newest["stack_fingerprint"])


def clusters_shipped(store: RecipeStore, model: str) -> list[str]:
    """Every cluster the model has a shipped recipe for (to say "the cluster changed" in words)."""
    return sorted({f"{row['accelerator']}:{row['gpus']}" for row in store.index()["entries"].values()
                   if row.get("model") == model and row.get("gate_passed")})
