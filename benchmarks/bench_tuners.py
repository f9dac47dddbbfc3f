"""The full tuner benchmark in one world: the bench recipes x planners x seeds, then the attune ablations.

    .venv/bin/python benchmarks/bench_tuners.py --world realistic      # 5 recipes x 7 planners x 5 seeds + ablations
    .venv/bin/python benchmarks/bench_tuners.py --world hard --seeds 2 --ablation-seeds 0

The recipes: the four MoE recipes of benchmarks/recipes/ at 64-256 GPUs and one well-tuned recipe
(tuned:, DeepSeek-V3-16B moved to the best layout the gate passes on each seed's cluster, where
nothing is left to find). Each seed runs on its own sibling cluster of the world. Runs `attune
bench` twice (the CLI, as a user would): the main comparison, then the attune planner with each
search rule switched off. Both share one gate cache (verdicts and proxy runs are deterministic in
their inputs), so the ablation's unchanged campaigns do not train the proxy again. Prints the
markdown tables and how long each part took; every figure is simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPES = (sorted(str(p) for p in (REPO / "benchmarks" / "recipes").glob("*.toml"))
           + ["tuned:" + str(REPO / "benchmarks" / "recipes" / "deepseek_v3_16b_h100x64.toml")])
PLANNERS = "attune,random,bayes,bayes-warm,estimator-topk,estimator-topk-naive,grid"


def bench(args: list[str], out: Path) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "attune.cli.main", "bench", *args, "--out", str(out), "--json"]
    env = dict(os.environ, PYTHONPATH=str(REPO), PREFECT_SERVER_ANALYTICS_ENABLED="false", MPLBACKEND="Agg")
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"attune bench failed ({proc.returncode}): {' '.join(cmd)}")
    return json.loads(proc.stdout), seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", nargs="+", default=RECIPES)
    p.add_argument("--planners", default=PLANNERS)
    p.add_argument("--world", default="realistic", help="easy | realistic | hard (default realistic)")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--ablation-seeds", type=int, default=5, help="0 skips the ablations")
    p.add_argument("--out", help="default .attune/bench-tuners-<world>")
    p.add_argument("--gate-cache", help="gate verdicts and proxy runs to share (default <out>/gate-cache); they do "
                                       "not depend on the world, so two worlds may share one")
    p.add_argument("--workers", type=int)
    a = p.parse_args()
    out = Path(a.out or REPO / ".attune" / f"bench-tuners-{a.world}").resolve()
    cache = Path(a.gate_cache).resolve() if a.gate_cache else out / "gate-cache"
    common = (["--recipes", *a.recipes, "--world", a.world, "--gate-cache", str(cache)]
              + (["--workers", str(a.workers)] if a.workers else []))

    main_run, main_s = bench([*common, "--planners", a.planners, "--seeds", str(a.seeds)], out / "main")
    print((out / "main" / "results.md").read_text())
    print(f"main benchmark: {len(main_run['results'])} rows, {main_s:.0f} s wall (CLI start to exit), "
          f"plot {main_run['plots'][0]}\n")
    if a.ablation_seeds > 0:
        abl, abl_s = bench([*common, "--planners", "attune", "--ablations", "--seeds", str(a.ablation_seeds)],
                           out / "ablations")
        print((out / "ablations" / "results.md").read_text())
        print(f"ablations: {abl_s:.0f} s wall\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
