"""The evaluator's view of the simulated cluster: ground-truth throughput, noise off, and the oracle.

The ONLY file of attune/bench that reads the simulated ground truth (tests/test_sim_honesty.py
allows it): single layouts and the oracle through attune/sim/oracle.py, and the whole space's
columns for the exact-tier oracle. It scores layouts a campaign already chose, and builds the
well-tuned recipes the benchmark starts some campaigns from; nothing here is ever shown to a
planner, and campaigns run in worker processes that never call it while they plan (the scoring
runs after the campaign flow has returned).
"""

from __future__ import annotations

from typing import Any

from attune.layout import resolve_layout
from attune.recipe import Recipe
from attune.sim.worlds import DEFAULT_WORLD
from attune.space import config_for


def truth_tps(recipe: Recipe, levers: dict[str, Any], cluster_seed: int, world: str = DEFAULT_WORLD) -> float:
    """Noise-free ground-truth tokens/s/GPU of the recipe under these levers (0 if it does not fit)."""
    from attune.sim.oracle import truth_tps as oracle_truth_tps

    layout = resolve_layout(config_for(recipe, levers), recipe.architecture, recipe.cluster)
    return oracle_truth_tps(recipe, layout, cluster_seed, world)


def oracle_json(recipe_json: str, cluster_seed: int, world: str = DEFAULT_WORLD) -> dict[str, Any]:
    """The oracle of a benchmark recipe on one cluster (run in a worker process; the argument is a
    BenchRecipe). For a tuned recipe `baseline_tps` is its tuned layout's and `tuned_levers` say which."""
    from attune.bench.request import BenchRecipe
    from attune.campaign.inputs import load_campaign_recipe
    from attune.sim.oracle import oracle

    bench = BenchRecipe.model_validate_json(recipe_json)
    recipe = load_campaign_recipe(bench.path, bench.cluster, bench.model_spec)
    result = oracle(recipe, cluster_seed=cluster_seed, world=world)
    best = result.best
    exact = exact_oracle(recipe, cluster_seed=cluster_seed, world=world)
    baseline = exact["levers"] if bench.tuned and exact else recipe.layout().levers()
    return {"recipe": bench.label, "cluster_seed": cluster_seed, "world": world,
            "tokens_per_sec_per_gpu": best.tokens_per_sec_per_gpu if best else None,
            "levers": best.levers if best else None, "evaluated": result.evaluated, "fitting": result.fitting,
            "seconds": result.seconds, "baseline_tps": truth_tps(recipe, baseline, cluster_seed, world),
            "tuned_levers": baseline if bench.tuned else None, "exact": exact, "simulated": True}


def exact_oracle(recipe: Recipe, max_checks: int = 5000, cluster_seed: int = 0,
                 world: str = DEFAULT_WORLD) -> dict[str, Any] | None:
    """The best layout a campaign could actually ship without a numerics question: the best on the
    ground truth that the gate's config check passes (no objective change, no known defect) with no
    numerics change (float8 as the baseline has it). Context for the oracle share, not a planner aid."""
    import numpy as np

    from attune.sim.arrays import FLOAT8_MODES
    from attune.sim.ground_truth import measure_many   # whole-space columns: oracle.py has no such call
    from attune.sim.space_arrays import space_arrays
    from gate.config_check import check_config

    arrays = space_arrays(recipe)
    cols = measure_many(recipe, arrays, cluster_seed, world)
    tps = np.where(cols["fits"] & (arrays.f8 == FLOAT8_MODES.index(recipe.layout().float8)), cols["tps"], -np.inf)
    for i in np.argsort(-tps)[:max_checks]:
        if not np.isfinite(tps[i]):
            break
        levers = arrays.layout(int(i)).levers()
        verdict = check_config(recipe, recipe.with_config(config_for(recipe, levers)))
        if verdict.passed and not verdict.numerics_change:
            return {"tokens_per_sec_per_gpu": float(tps[i]), "levers": levers}
    return None
