"""What the benchmark runs when the cluster search found no cluster for a recipe: no campaign runs here."""

from __future__ import annotations

import pytest
from conftest import REPO

from attune.bench.request import bench_cells, bench_recipes, parse_planners
from attune.errors import InputError

RECIPE = str(REPO / "benchmarks" / "recipes" / "deepseek_v3_16b_h100x64.toml")


def test_a_recipe_that_runs_on_no_sibling_cluster_is_refused_by_name_not_benchmarked_on_others():
    """An empty list is the cluster search's answer (none of the siblings tried runs the recipe), not
    a missing one: falling back on clusters 1..N would benchmark a recipe that does not run there and,
    for a tuned one, the untuned file (no tuned file exists for a cluster the search did not pick)."""
    public, tuned = bench_recipes([RECIPE, "tuned:" + RECIPE])
    (variant,) = parse_planners("attune")
    with pytest.raises(InputError, match=r"deepseek_v3_16b-tuned@h100:64: .*none of .*'hard' world") as refused:
        bench_cells([public, tuned], [variant], seeds=2, world="hard", clusters={public.label: [1, 3], tuned.label: []})
    assert "deepseek_v3_16b-public" not in str(refused.value)
    with pytest.raises(InputError, match=r"deepseek_v3_16b-public@h100:64: "):
        bench_cells([public], [variant], seeds=1, world="hard", clusters={public.label: []})


def test_without_a_cluster_search_each_seed_gets_its_default_cluster():
    """The up-front refusal (before any oracle is computed) passes no clusters: seed s, cluster s + 1."""
    (public,) = bench_recipes([RECIPE])
    (variant,) = parse_planners("attune")
    cells = bench_cells([public], [variant], seeds=2, world="hard")
    assert [(c.seed, c.cluster_seed, c.path) for c in cells] == [(0, 1, public.path), (1, 2, public.path)]
    fewer = bench_cells([public], [variant], seeds=3, world="hard", clusters={public.label: [2]})
    assert [(c.seed, c.cluster_seed) for c in fewer] == [(0, 2)]    # runs on one: benchmarked on that one


def test_a_budget_share_scales_the_convention_budget_per_cluster():
    """The budget curve's knob: 1/4 of 40 GPU-hours per 64 GPUs; an explicit budget wins over it."""
    (full,) = bench_recipes([RECIPE])
    (quarter,) = bench_recipes([RECIPE], budget_share=0.25)
    assert quarter.budget_gpu_hours == pytest.approx(full.budget_gpu_hours / 4)
    (given,) = bench_recipes([RECIPE], budget_gpu_hours=7.0, budget_share=0.25)
    assert given.budget_gpu_hours == 7.0
    with pytest.raises(InputError, match="--budget-share"):
        bench_recipes([RECIPE], budget_share=0)
