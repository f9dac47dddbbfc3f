"""Re-measure the shipped recipe on tonight's stack: k replicates, charged to the nightly budget.

The result is saved in the night's folder, so a retried nightly run reads it instead of paying
for the replicates again.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from attune.campaign.budget import gpu_hours
from attune.files import atomic_write_text
from attune.nightly.regression import Remeasure, judge
from attune.nightly.registry import RegisteredRecipe
from attune.recipe import Recipe, recipe_from_dict
from attune.spec import StackSpec
from attune.stacks.registry import make_stack
from attune.store import StoreEntry


def shipped_recipe(entry: StoreEntry, stack: StackSpec, name: str) -> Recipe:
    """The shipped recipe as it runs tonight: its config, tonight's stack, the production name."""
    recipe = recipe_from_dict(tomllib.loads(entry.recipe_toml), origin=f"store entry {entry.key}")
    return recipe.model_copy(update={"stack": stack, "name": name})


def estimated_cost(registered: RegisteredRecipe, recipe: Recipe) -> float:
    stack = make_stack(registered.stack, **registered.stack_options)
    one = gpu_hours(recipe.cluster.gpus, stack.estimate_wall_time_s(recipe, registered.steps_per_trial))
    return one * registered.replicates


def remeasure(entry: StoreEntry, recipe: Recipe, registered: RegisteredRecipe, workdir: Path,
              seed: int) -> Remeasure:
    saved = workdir / "remeasure.json"
    if saved.is_file():
        return Remeasure.model_validate_json(saved.read_text())
    stack = make_stack(registered.stack, **registered.stack_options)
    samples, statuses, spent = [], [], 0.0
    for i in range(registered.replicates):
        run_dir = workdir / f"remeasure-{i}"
        run_dir.mkdir(parents=True, exist_ok=True)
        result = stack.run_trial(recipe, registered.steps_per_trial, seed * 7919 + i, run_dir)
        spent += result.gpu_hours
        statuses.append(result.status.value)
        if result.ok and result.tokens_per_sec_per_gpu:
            samples.append(float(result.tokens_per_sec_per_gpu))
    found = judge(samples, statuses, entry.tokens_per_sec_per_gpu, entry.stack_fingerprint, spent,
                  floor=registered.regression_floor, confidence=registered.confidence)
    atomic_write_text(saved, found.model_dump_json(indent=1))
    return found
