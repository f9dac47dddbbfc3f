"""Seconds a trial spends on dispatch through the Slurm work pool, against the same trial run
straight with srun from the login node.

    .venv/bin/python benchmarks/bench_slurm_dispatch.py [--repeats 3] [--steps 2] [--json]

Brings up what tests/slurm_pool.py brings up (two-node Slurm on loopback, `prefect server`, moto's
S3 with the result block, `attune deploy`, the worker of infra/slurm/start-worker.sh), then runs
the two-node debug trial (recipes/cpu/llama3_debug_2node.toml) alternately

  direct   run_on_worker(..., launcher="slurm") in a fresh process: srun + torchrun, no Prefect
  pool     `attune trial run` with ATTUNE_TORCHTITAN_DEPLOYMENT: a deployment run the worker picks
           up, the same srun inside its flow, the result back through S3

and prints the caller's wall seconds of each, their medians and the difference (the dispatch
overhead per trial), with what the trial itself measured (its run inside srun) beside them. Both
arms start a Python process, so interpreter start-up cancels out. About 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

DIRECT = """
import json, sys
from pathlib import Path
from attune.recipe import load_recipe
from attune.stacks.torchtitan.deployment import run_on_worker
from attune.stacks.torchtitan.stack import TorchtitanStack
from attune.stacks.torchtitan.runner import RunLimits
recipe, workdir, steps = load_recipe(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
stack = TorchtitanStack(warmup_steps=1, rdzv_endpoint="env")
launch = stack.launch(recipe, steps, 0, workdir)
limits = RunLimits(measure_steps=steps, warmup_steps=1)
out = run_on_worker(launch.argv, launch.env, str(workdir / "train.log"), limits.model_dump(), str(workdir),
                    "slurm", launch.nnodes, launch.nproc_per_node)
print(json.dumps(out))
"""


def run_direct(pool, workdir: Path, steps: int) -> tuple[float, float]:
    started = time.monotonic()
    # the worker runs with its venv on PATH (infra/slurm/start-worker.sh); srun's tasks need torchrun there too
    env = pool.env | {"PATH": f"{Path(sys.executable).parent}:{pool.env.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", DIRECT, str(pool_recipe()), str(workdir), str(steps)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"direct trial failed:\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["status"] != "ok":
        raise RuntimeError(f"direct trial ended {out['status']}: {out['message']}")
    return wall, out.get("allocation_s") or out["wall_time_s"]


def run_pool(pool, workdir: Path, steps: int) -> tuple[float, float]:
    from slurm_pool import DEPLOYMENT
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "attune.cli.main", "trial", "run", str(pool_recipe()), "--steps",
                           str(steps), "--warmup", "1", "--workdir", str(workdir), "--json"],
                          env=pool.env | {"ATTUNE_TORCHTITAN_DEPLOYMENT": DEPLOYMENT,
                                          "ATTUNE_TORCHTITAN_LAUNCHER": "slurm"},
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"pooled trial failed:\n{proc.stdout}\n{proc.stderr[-2000:]}\n{pool.worker_tail()}")
    out = json.loads(proc.stdout)
    return wall, out["breakdown"].get("allocation_s") or out["wall_time_s"]


def pool_recipe() -> Path:
    from slurm_pool import RECIPE
    return RECIPE


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="trials per arm (alternating)")
    parser.add_argument("--steps", type=int, default=2, help="measured steps per trial (after 1 warm-up)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from slurm_cluster import missing_binaries, slurm_cluster
    from slurm_pool import slurm_pool_for

    missing = missing_binaries()
    if missing:
        print(f"bench_slurm_dispatch: Slurm is not installed (missing {', '.join(missing)})", file=sys.stderr)
        return 2
    rows: dict[str, list[tuple[float, float]]] = {"direct": [], "pool": []}
    with tempfile.TemporaryDirectory(prefix="attune-dispatch-") as tmp:
        root = Path(tmp)
        with slurm_cluster(root / "slurm") as slurm, slurm_pool_for(slurm, root / "pool") as pool:
            for i in range(args.repeats):
                for arm, run in (("direct", run_direct), ("pool", run_pool)):
                    wall, inner = run(pool, root / f"{arm}-{i}", args.steps)
                    rows[arm].append((wall, inner))
                    print(f"  {arm:6} #{i + 1}: {wall:6.1f} s at the caller, {inner:6.1f} s in the allocation",
                          file=sys.stderr, flush=True)
    median = {arm: statistics.median(w for w, _ in r) for arm, r in rows.items()}
    inner = {arm: statistics.median(i for _, i in r) for arm, r in rows.items()}
    report = {"repeats": args.repeats, "steps": args.steps, "median_wall_s": median, "median_allocation_s": inner,
              "dispatch_overhead_s": median["pool"] - median["direct"],
              "walls_s": {arm: [round(w, 2) for w, _ in r] for arm, r in rows.items()}}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"two-node debug trial, {args.repeats} per arm, median wall at the caller:")
        print(f"  direct srun      {median['direct']:6.1f} s   (allocation {inner['direct']:.1f} s)")
        print(f"  Slurm work pool  {median['pool']:6.1f} s   (allocation {inner['pool']:.1f} s)")
        print(f"  dispatch overhead per trial: {report['dispatch_overhead_s']:+.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
