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

from attune.recipe import Recipe
from attune.sim.worlds import DEFAULT_WORLD
from attune.space import layout_of, recipe_at


def truth_tps(recipe: Recipe, levers: dict[str, Any], cluster_seed: int, world: str = DEFAULT_WORLD) -> float:
    """Noise-free ground-truth tokens/s/GPU of the recipe under these levers (0 if it does not fit)."""
    from attune.sim.oracle import truth_tps as oracle_truth_tps

    layout = layout_of(recipe, levers)
    return oracle_truth_tps(recipe, layout, cluster_seed, world)


def oracle_json(recipe_json: str, cluster_seed: int, world: str = DEFAULT_WORLD) -> dict[str, Any]:
    """The oracles of a benchmark recipe on one cluster (run in a worker process; the argument is a
    BenchRecipe): `tokens_per_sec_per_gpu` and `levers` are the best layout the gate's config check
    passes (what a campaign could ship at best, float8 included: only the proxy can refuse it),
    `any_layout` the best of the whole lever space (known defects included), `exact` the best without
    a numerics change. For a tuned recipe `baseline_tps` is its tuned layout's (`tuned_levers`)."""
    from attune.bench.request import BenchRecipe
    from attune.campaign.inputs import load_campaign_recipe
    from attune.sim.oracle import oracle

    bench = BenchRecipe.model_validate_json(recipe_json)
    recipe = load_campaign_recipe(bench.path, bench.cluster, bench.model_spec)
    result = oracle(recipe, cluster_seed=cluster_seed, world=world)
    best = result.best
    gated, exact = shippable_oracles(recipe, cluster_seed=cluster_seed, world=world)
    baseline = exact["levers"] if bench.tuned and exact else recipe.layout().levers()
    return {"recipe": bench.label, "cluster_seed": cluster_seed, "world": world,
            "tokens_per_sec_per_gpu": gated["tokens_per_sec_per_gpu"] if gated else None,
            "levers": gated["levers"] if gated else None,
            "any_layout": {"tokens_per_sec_per_gpu": best.tokens_per_sec_per_gpu, "levers": best.levers} if best else None,
            "evaluated": result.evaluated, "fitting": result.fitting,
            "seconds": result.seconds, "baseline_tps": truth_tps(recipe, baseline, cluster_seed, world),
            "tuned_levers": baseline if bench.tuned else None, "exact": exact, "simulated": True}


def shippable_oracles(recipe: Recipe, max_checks: int = 5000, cluster_seed: int = 0,
                      world: str = DEFAULT_WORLD) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The best layouts on the ground truth that the gate's config check passes (no objective
    change, no known defect): any (float8 included, which only the proxy's convergence check can
    still refuse) and exact (no numerics change: float8 as the baseline has it). Each {tps, levers}
    or None. Context for the oracle share, never a planner aid."""
    import numpy as np

    from attune.sim.arrays import FLOAT8_MODES
    from attune.sim.ground_truth import measure_many   # whole-space columns: oracle.py has no such call
    from attune.sim.space_arrays import space_arrays
    from attune.gate.config_check import check_config

    arrays = space_arrays(recipe)
    cols = measure_many(recipe, arrays, cluster_seed, world)
    tps = np.where(cols["fits"], cols["tps"], -np.inf)
    same_float8 = arrays.f8 == FLOAT8_MODES.index(recipe.layout().float8)
    best: dict[bool, dict[str, Any] | None] = {False: None, True: None}   # keyed by "exact"
    checks = 0
    for i in np.argsort(-tps):
        if not np.isfinite(tps[i]) or checks >= max_checks or None not in best.values():
            break
        if best[False] is not None and not same_float8[i]:
            continue   # only an exact one is still wanted
        checks += 1
        levers = arrays.layout(int(i)).levers()
        verdict = check_config(recipe, recipe_at(recipe, levers))
        if not verdict.passed:
            continue
        found = {"tokens_per_sec_per_gpu": float(tps[i]), "levers": levers}
        if best[False] is None:
            best[False] = found
        if not verdict.numerics_change and best[True] is None:
            best[True] = found
    return best[False], best[True]
