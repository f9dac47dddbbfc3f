"""Speed of the simulated cluster on one core: step evaluations per second and oracle seconds.

    .venv/bin/python benchmarks/bench_sim.py

Prints evaluations/s of the scalar path (estimate(recipe, layout), one layout per call) and of the
vectorised paths (estimate_many and the ground truth over whole lever spaces), then the oracle's
time over the full lever space of two 256-GPU MoE recipes and of llama3.1-405b on h100:128.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"   # one core: set before numpy is imported

import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attune.recipe import recipe_from_dict  # noqa: E402
from attune.sim.estimator import estimate, estimate_many  # noqa: E402
from attune.sim.ground_truth import measure_many  # noqa: E402
from attune.sim.oracle import oracle  # noqa: E402
from attune.sim.space_arrays import space_arrays  # noqa: E402


def recipe(model: str, accel: str, gpus: int, **config):
    cfg = {k.replace("__", "."): v for k, v in config.items()}
    return recipe_from_dict({"name": f"{model}-{accel}x{gpus}", "model": model,  # a recipe name is a safe name
                             "cluster": {"accelerator": accel, "gpus": gpus},
                             "stack": {"torch": "2.13.0", "torchtitan": "0.3.0"}, "config": cfg})


# GPipe: these bases run one micro-batch per pipeline flush (local batch 1), which torch's 1F1B
# refuses at pp > 1 (the micro-batch rule, attune/layout.py); the spaces searched are the same.
MOE_256 = [
    recipe("deepseek-v3-671b", "h100", 256, training__local_batch_size=1, training__global_batch_size=1024,
           training__seq_len=4096, parallelism__expert_parallel_degree=32, parallelism__pipeline_parallel_degree=8,
           parallelism__pipeline_parallel_schedule="GPipe", activation_checkpoint__mode="full"),
    recipe("qwen3-235b-a22b", "h100", 256, training__local_batch_size=1, training__global_batch_size=1024,
           training__seq_len=4096, parallelism__expert_parallel_degree=8, parallelism__pipeline_parallel_degree=4,
           parallelism__pipeline_parallel_schedule="GPipe", activation_checkpoint__mode="full"),
]
DENSE_128 = recipe("llama3.1-405b", "h100", 128, training__local_batch_size=1, training__global_batch_size=256,
                   training__seq_len=8192, parallelism__tensor_parallel_degree=8, parallelism__pipeline_parallel_degree=8,
                   parallelism__pipeline_parallel_schedule="GPipe", activation_checkpoint__mode="full")


def rate(fn, n: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return n / dt, dt


def main() -> None:
    print(f"threads: OMP/OPENBLAS/MKL = 1; python {sys.version.split()[0]}")
    r = MOE_256[1]
    space = space_arrays(r)
    layouts = [space.layout(i) for i in range(0, len(space), max(1, len(space) // 2000))]
    scalar, _ = rate(lambda: [estimate(r, x) for x in layouts], len(layouts))
    print(f"scalar   estimate(recipe, layout)           {scalar:>12,.0f} evaluations/s  ({len(layouts)} layouts, {r.name})")
    vec, dt = rate(lambda: estimate_many(r, space), len(space))
    print(f"vector   estimate_many(recipe, space)       {vec:>12,.0f} evaluations/s  ({len(space):,} layouts in {dt:.2f} s)")
    gt, dt = rate(lambda: measure_many(r, space), len(space))
    print(f"vector   ground truth (hidden effects)      {gt:>12,.0f} evaluations/s  ({len(space):,} layouts in {dt:.2f} s)")
    for rec in MOE_256 + [DENSE_128]:
        result = oracle(rec)
        best = result.best
        what = (f"best {best.tokens_per_sec_per_gpu:,.0f} tok/s/GPU" if best else "nothing fits")
        print(f"oracle   {rec.name:28} {result.seconds:6.2f} s  {result.evaluated:>10,} layouts "
              f"({result.fitting:,} fit), {what}")


if __name__ == "__main__":
    main()
