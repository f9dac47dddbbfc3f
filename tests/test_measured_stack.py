"""The measured stack replays a table of real runs: noise from the run's own steps, the memory limit
applied to its measured peak, crashes kept, a missing layout refused, the estimate never from it."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from attune.errors import InputError
from attune.recipe import load_recipe
from attune.space import iter_layouts, recipe_at
from attune.stacks.base import TrialStatus
from attune.stacks.measured import MeasuredStack, layout_key

RECIPE = REPO / "benchmarks/cpu/llama3_debug_search.toml"   # hbm_gib 0.85 per process


def _table(tmp_path, records):
    path = tmp_path / "sweep.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _record(levers, status="ok", step_tps=(400.0, 420.0, 380.0, 410.0), peak=0.7, wall=30.0):
    return {"levers": levers, "status": status, "wall_time_s": wall, "peak_memory_gib": peak,
            "step_tps": list(step_tps), "steps_logged": 6, "warmup_steps": 2, "message": "boom" if status != "ok" else ""}


def test_a_trial_replays_its_layouts_run_with_the_seeds_resampling(tmp_path):
    recipe = load_recipe(RECIPE)
    levers = recipe.layout().levers()
    stack = MeasuredStack(table=str(_table(tmp_path, [_record(levers)])))
    runs = [stack.run_trial(recipe, steps=4, seed=s, workdir=tmp_path) for s in (0, 0, 1, 2, 3)]
    assert all(r.status == TrialStatus.OK and not r.simulated for r in runs)
    assert runs[0].tokens_per_sec_per_gpu == runs[1].tokens_per_sec_per_gpu              # same seed, same trial
    assert len({r.tokens_per_sec_per_gpu for r in runs}) > 2                              # seeds differ
    assert all(380.0 <= r.tokens_per_sec_per_gpu <= 420.0 for r in runs)                # within the run's steps
    assert runs[0].wall_time_s == pytest.approx(30.0, rel=0.1) and runs[0].gpu_hours > 0
    longer = stack.run_trial(recipe, steps=40, seed=0, workdir=tmp_path)
    assert longer.wall_time_s > runs[0].wall_time_s + 30 * 1024 / 2 / 420                # charged per step


def test_memory_limit_crashes_and_missing_layouts(tmp_path):
    recipe = load_recipe(RECIPE)
    layouts = [layout.levers() for layout in iter_layouts(recipe)][:3]
    stack = MeasuredStack(table=str(_table(tmp_path, [_record(layouts[0], peak=0.9),
                                                       _record(layouts[1], status="crash", step_tps=())])))
    over = stack.run_trial(recipe_at(recipe, layouts[0]), steps=4, seed=0, workdir=tmp_path)
    assert over.status == TrialStatus.OOM and "above the 0.85 GiB" in over.message
    assert over.wall_time_s < 30.0                                                        # ends after step 1
    assert stack.run_trial(recipe_at(recipe, layouts[1]), steps=4, seed=0, workdir=tmp_path).status == TrialStatus.CRASH
    with pytest.raises(InputError, match="has no run of the layout"):
        stack.run_trial(recipe_at(recipe, layouts[2]), steps=4, seed=0, workdir=tmp_path)
    # the planners' estimate is the public one: the same whatever the table says
    other = MeasuredStack(table=str(_table(tmp_path / "..", [_record(layouts[0], step_tps=(5.0,))])))
    assert (stack.estimate_wall_time_s(recipe_at(recipe, layouts[0]), 10)
            == other.estimate_wall_time_s(recipe_at(recipe, layouts[0]), 10))


def test_layout_keys_ignore_order_and_a_missing_table_is_one_line(monkeypatch):
    assert layout_key({"a": 1, "b": "x"}) == layout_key(json.loads(json.dumps({"b": "x", "a": 1})))
    monkeypatch.delenv("ATTUNE_MEASURED_TABLE", raising=False)
    with pytest.raises(InputError, match="needs a table"):
        MeasuredStack()
    with pytest.raises(InputError, match="is not a file"):
        MeasuredStack(table="/nonexistent/sweep.jsonl")


SWEEP = REPO / "benchmarks/cpu/sweep-cpu2-2026-12-06.jsonl"
TIGHT = REPO / "benchmarks/cpu/llama3_debug_search_tight.toml"


def test_the_shipped_sweep_covers_the_benchmark_space_and_the_estimator_fits_a_cpu():
    from attune.sim.estimator import estimate
    from attune.stacks.measured import MeasuredTable
    table = MeasuredTable(SWEEP)
    for path in (RECIPE, TIGHT):
        recipe = load_recipe(path)
        assert all(table.record(layout.levers()) for layout in iter_layouts(recipe))   # every layout measured
        # a CPU process has no CUDA context: the public estimate of the baseline fits its 0.80-0.85 GiB
        assert estimate(recipe).fits and estimate(recipe).peak_memory_gib < recipe.cluster.memory_gib


def test_a_replayed_campaign_under_a_narrowed_space_stays_inside_it(cli):
    """The tight recipe's [search] leaves out selective recomputation; the attune planner's memory
    compensations proposed it anyway (a trial the table has no run of) before they read the space.
    Run as a user would: `attune tune --stack measured` with the table in ATTUNE_MEASURED_TABLE."""
    from attune.space import lever_domains
    proc = cli("tune", TIGHT, "--stack", "measured", "--budget-gpu-hours", "0.25", "--json",
               env_extra={"ATTUNE_MEASURED_TABLE": str(SWEEP)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    domains = lever_domains(load_recipe(TIGHT))
    assert result["trials"] >= 3 and not result["simulated"] and result["stack"] == "measured"
    assert all(result["best"]["levers"][k] in values for k, values in domains.items())
    assert result["gpu_hours_used"] <= 0.25
