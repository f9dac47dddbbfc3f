"""How good a guide the public estimator is in each simulated world (what no planner may see).

    .venv/bin/python benchmarks/bench_worlds.py                 # 4 MoE benchmark recipes x 5 siblings x 3 worlds
    .venv/bin/python benchmarks/bench_worlds.py --clusters 2 --sample 500

Per world, over the benchmark recipes' lever spaces on sibling clusters 1..N (the clusters the tuner
benchmark's seeds run on): the estimator's median and p90 error per layout (a random sample of valid
layouts), Spearman's rank correlation over its 100 best-ranked layouts, and how much of the truth's
best throughput its best layout (top 1) and the best of its top 10 reach, plus how often those miss
by more than 3%. The reference cluster (cluster_seed 0) is the same in every world. Simulated.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from attune.recipe import load_recipe  # noqa: E402
from attune.sim.fidelity import estimator_fidelity  # noqa: E402
from attune.sim.worlds import world_names  # noqa: E402

RECIPES = sorted(p for p in (REPO / "benchmarks" / "recipes").glob("*.toml") if "tuned" not in p.name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clusters", type=int, default=5, help="sibling clusters per recipe (default 5)")
    p.add_argument("--sample", type=int, default=2000, help="layouts sampled per cluster for the error (default 2000)")
    a = p.parse_args()
    recipes = [load_recipe(path) for path in RECIPES]
    print("| world | median error | p90 error | rank correlation (top 100) | top-1 share | top-10 share "
          "| top-1 misses > 3% | top-10 misses > 3% | clusters |")
    print("|---|---|---|---|---|---|---|---|---|")
    for world in world_names():
        started = time.monotonic()
        rows = [estimator_fidelity(r, c, world, sample=a.sample) for r in recipes for c in range(1, a.clusters + 1)]
        col = {k: np.array([row[k] for row in rows]) for k in rows[0]}
        print(f"| {world} | {np.median(col['median_error']):.1%} | {np.median(col['p90_error']):.1%} "
              f"| {np.median(col['rank_correlation']):.2f} | {np.mean(col['top1_share']):.1%} "
              f"| {np.mean(col['top10_share']):.1%} | {np.mean(col['top1_share'] < 0.97):.0%} "
              f"| {np.mean(col['top10_share'] < 0.97):.0%} | {len(rows)} ({time.monotonic() - started:.0f} s) |")
    print(f"\n{len(recipes)} recipes ({', '.join(r.name + '@' + r.cluster.label for r in recipes)}), "
          f"siblings 1..{a.clusters}; medians over clusters except the shares (means). Simulated.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
