"""The campaign's domain: budget, noise band, diagnosis, persisted state, the final result.

Plain Python; the Prefect flow (flows/campaign.py) and tasks (tasks/) wrap these functions.
"""

from __future__ import annotations

from typing import Any


def run_campaign_for_seed(recipe_path: str, cluster: str, budget: float, seed: int = 0) -> Any:
    """One sim campaign for seeding the leaderboard: the store entry it shipped, or None.

    The campaign publishes what it ships to the default recipe store; the entry is read back
    from there so the caller gets exactly what was stored.
    """
    from attune.store import open_store
    from flows.campaign import load_campaign_recipe, tune_campaign

    result = tune_campaign(recipe_path, budget, cluster=cluster, seed=seed, quiet=True)
    if not result["shipped"]:
        return None
    recipe = load_campaign_recipe(recipe_path, cluster)
    return open_store(None).get(recipe.model_name, recipe.cluster.label, recipe.stack.fingerprint())
