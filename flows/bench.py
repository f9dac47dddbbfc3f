"""The tuner benchmark flow: every (recipe, planner, seed) campaign on the sim stack, same budget.

    recipes x seeds (one simulated cluster each) ──► oracle per recipe and cluster ─┐
                                   (a tuned recipe: moved to its cluster's best gated layout)
    recipes x planners x seeds ──► campaigns (a process pool, each worker its own Prefect,
                                   MLflow and ATTUNE_HOME) ──────────────────────┴─► score on the ground truth
    ──► summary per recipe and planner ──► targets ──► JSON, markdown, PNG ──► MLflow + Prefect artifact

Each campaign is the real campaign flow (flows/campaign.py) running in its worker. The oracle and
the scoring read the simulated ground truth through attune/bench/truth.py: the benchmark is an
evaluator, the planners never see it. Every number it reports is simulated.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from attune.bench import report
from attune.bench.code import watched
from attune.bench.request import (BenchCell, BenchRecipe, bench_cells, bench_recipes, oracle_key, parse_planners,
                                  write_tuned_recipe)
from attune.bench.summary import public_rows, summarize
from attune.bench.targets import check_targets
from attune.files import attune_home
from attune.flows import bench_pool as pool


MAX_CLUSTERS_TRIED = 4   # per seed: siblings looked at for one on which the recipe runs


@task(name="bench-oracle", cache_policy=NO_CACHE)
def oracle_of(recipe: BenchRecipe, cluster_seed: int, world: str) -> dict[str, Any]:
    from attune.bench.truth import oracle_json
    return pool.submit(oracle_json, recipe.model_dump_json(), cluster_seed, world).result()


def runnable_clusters(bench: list[BenchRecipe], seeds: int, world: str) -> tuple[dict[str, list[int]], dict[str, dict]]:
    """Per recipe, the first `seeds` sibling clusters (cluster_seed 1, 2, ...) on which its own layout
    runs, and the oracle of each; a recipe that runs on too few of them is benchmarked on fewer."""
    clusters: dict[str, list[int]] = {r.label: [] for r in bench}
    oracles: dict[str, dict] = {}
    tried = 0
    while tried < seeds * MAX_CLUSTERS_TRIED and any(len(c) < seeds for c in clusters.values()):
        wanted = {r.label: seeds - len(clusters[r.label]) for r in bench}
        futures = {oracle_key(r.label, tried + 1 + i): (r, tried + 1 + i, oracle_of.submit(r, tried + 1 + i, world))
                   for r in bench for i in range(wanted[r.label])}
        tried += max(wanted.values())
        for key, (r, cluster_seed, future) in sorted(futures.items(), key=lambda kv: kv[1][1]):
            oracles[key] = future.result()
            if oracles[key]["baseline_tps"] > 0 and len(clusters[r.label]) < seeds:
                clusters[r.label].append(cluster_seed)
    return clusters, oracles


@task(name="bench-tuned-recipe", cache_policy=NO_CACHE)
def tuned_recipe(recipe: BenchRecipe, oracle: dict[str, Any], folder: Path) -> str:
    return write_tuned_recipe(recipe, oracle, folder)


@task(name="bench-campaign", cache_policy=NO_CACHE)
def campaign_cell(cell: BenchCell, total: int, started: float, quiet: bool) -> dict[str, Any]:
    row = pool.submit_cell(cell.model_dump_json()).result()
    if not quiet:
        gain = "error: " + row["error"][:120] if row.get("error") else (
            f"gain {row['gain']:+.1%} in {row['gpu_hours_used']:.1f}/{row['budget_gpu_hours']:g} GPU-h")
        print(f"[bench {time.monotonic() - started:6.0f}s] {cell.key}: {gain} ({row['seconds']:.0f}s)",
              file=sys.stderr, flush=True)
    return row


def _out_dir(out: str | None) -> Path:
    return Path(out).resolve() if out else attune_home() / "bench" / time.strftime("%Y%m%d-%H%M%S")


@flow(name="tuner-benchmark", task_runner=ThreadPoolTaskRunner(max_workers=16))
def tuner_benchmark(recipes: list[str], planners: str = "attune,random,bayes,estimator-topk",
                    budget_gpu_hours: float | None = None, seeds: int = 5, world: str = "realistic",
                    budget_share: float = 1.0,
                    cluster: str | None = None,
                    model_spec: str | None = None, steps_per_trial: int = 10, replicates: int = 3,
                    gate_steps: int | None = None, gate_seed: int | None = 0,
                    disabled_rules: list[str] | None = None,
                    ablations: bool = False, workers: int | None = None, out: str | None = None,
                    gate_cache: str | None = None, mlflow_uri: str | None = None,
                    quiet: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    with watched() as code:   # the sources the workers will import, and again after the last campaign
        variants = parse_planners(planners, disabled_rules, ablations)
        bench = bench_recipes(recipes, cluster, model_spec, budget_gpu_hours, budget_share)
        bench_cells(bench, variants, seeds, steps_per_trial, replicates, gate_steps, gate_seed, world)  # refuse early
        out_dir = _out_dir(out)
        homes = out_dir / "work"
        shutil.rmtree(homes, ignore_errors=True)   # a re-run measures afresh, never resumes old campaigns
        workers = max(1, min(workers or pool.default_workers(), len(bench) * len(variants) * seeds))

        pool.open_pool(workers, homes, pool.current_prefect_api(), Path(gate_cache).resolve() if gate_cache else None)
        try:
            clusters, oracle = runnable_clusters(bench, seeds, world)
            tuned = {key: tuned_recipe(r, oracle[key], out_dir / "tuned-recipes")
                     for r in bench if r.tuned for c in clusters[r.label] for key in [oracle_key(r.label, c)]}
            cells = bench_cells(bench, variants, seeds, steps_per_trial, replicates, gate_steps, gate_seed, world,
                                clusters, tuned)
            cell_futures = [campaign_cell.submit(c, len(cells), started, quiet) for c in cells]
            rows_in = [f.result() for f in cell_futures]
        finally:
            pool.close_pool()

    rows = summarize(rows_in, oracle)
    checks = check_targets(rows, world=world)
    seconds = time.monotonic() - started
    meta = {"campaigns": len(cells), "seeds": seeds, "workers": workers, "seconds": seconds, "world": world,
            "code": code["digest"] if not code["changed_during_run"]
            else f"{code['digest']} -> {code['after']} (CHANGED during the run)"}
    markdown = report.markdown(rows, checks, meta, oracle)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"results": public_rows(rows), "targets": checks, "oracle": oracle, "simulated": True,
               "settings": {"recipes": [r.model_dump() for r in bench], "planners": [v.model_dump() for v in variants],
                            "seeds": seeds, "world": world, "clusters": clusters,
                            "steps_per_trial": steps_per_trial, "replicates": replicates,
                            "gate_seed": gate_seed, "workers": workers},
               "code": code,
               "seconds": seconds, "out": str(out_dir)}
    files = [out_dir / "results.json", out_dir / "results.md", out_dir / "cells.json"]
    files[0].write_text(json.dumps(payload, indent=1, default=str))
    files[1].write_text(markdown)
    files[2].write_text(json.dumps(rows_in, indent=1, default=str))
    files.append(report.plot(rows_in, oracle, out_dir / "bench.png"))
    if any(v.disabled_rules for v in variants):
        files.append(report.plot(rows_in, oracle, out_dir / "bench-ablations.png", include_ablations=True))
    payload["plots"] = [str(p) for p in files[3:]]
    params = {"planners": ",".join(v.label for v in variants), "seeds": seeds, "workers": workers, "world": world,
              "budgets": ",".join(f"{r.label}={r.budget_gpu_hours:g}" for r in bench),
              "steps_per_trial": steps_per_trial, "replicates": replicates}
    payload["mlflow_run_id"] = log_summary(mlflow_uri, rows, checks, params, files, seconds)
    create_markdown_artifact(markdown=markdown, key="tuner-benchmark", description="ATTUNE tuner benchmark (simulated)")
    return payload


@task(name="bench-mlflow", cache_policy=NO_CACHE)
def log_summary(uri, rows, checks, params, files, seconds) -> str:
    from attune.bench.tracking import log_benchmark
    return log_benchmark(uri, rows, checks, params, files, seconds)
