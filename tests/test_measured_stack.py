"""The measured stack replays a table of real runs: noise from the run's own steps, the memory limit
applied to its measured peak, crashes kept, a missing layout refused, the estimate never from it."""

from __future__ import annotations

import json

import numpy as np
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


def test_a_trial_replays_one_of_its_layouts_runs_and_reports_the_median_step(tmp_path):
    recipe = load_recipe(RECIPE)
    levers = recipe.layout().levers()
    fast, slow = (400.0, 420.0, 380.0, 410.0), (300.0, 310.0, 290.0, 305.0)
    stack = MeasuredStack(table=str(_table(tmp_path, [_record(levers, step_tps=fast) | {"run": 0},
                                                       _record(levers, step_tps=slow) | {"run": 1}])))
    runs = [stack.run_trial(recipe, steps=5, seed=s, workdir=tmp_path) for s in range(12)]
    assert all(r.status == TrialStatus.OK and not r.simulated for r in runs)
    assert stack.run_trial(recipe, steps=5, seed=3, workdir=tmp_path) == runs[3]           # same seed, same trial
    for r in runs:   # the median of the steps it drew, as the torchtitan stack reports a trial
        assert r.tokens_per_sec_per_gpu == pytest.approx(float(np.median([m.tps for m in r.steps])))
    drawn = {r.breakdown["replayed_run"] for r in runs}
    assert drawn == {0, 1}                                                                 # run-to-run noise
    # two draws of one run are not the same measurement (a smoothed bootstrap): a campaign that drew
    # the baseline's run twice read zero noise off it; and trials vary as much as the runs did
    same = [r.tokens_per_sec_per_gpu for r in runs if r.breakdown["replayed_run"] == 0]
    assert len(same) > 1 and len(set(same)) == len(same)
    many = [stack.run_trial(recipe, steps=5, seed=s, workdir=tmp_path).tokens_per_sec_per_gpu for s in range(300)]
    spread = float(np.std(np.log(many), ddof=1))
    run_sd = float(np.std(np.log([np.median(fast), np.median(slow)]), ddof=1))
    assert 0.75 * run_sd < spread < 1.35 * run_sd
    assert runs[0].wall_time_s == pytest.approx(30.0, rel=0.15) and runs[0].gpu_hours > 0
    longer = stack.run_trial(recipe, steps=40, seed=0, workdir=tmp_path)
    assert longer.wall_time_s > runs[0].wall_time_s + 30 * 1024 / 2 / 420                 # charged per step
    from attune.stacks.measured import MeasuredTable
    table = MeasuredTable(stack.table.path)
    assert table.layout_tps(levers) == pytest.approx((np.median(fast) + np.median(slow)) / 2)
    assert table.run_to_run_sd() > 0.1


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


def test_the_estimate_is_the_public_prior_never_the_table(tmp_path):
    """What a replayed run measured reaches a campaign as it would from a live run (attune.campaign.
    costs learns it); the stack's own estimate stays torchtitan's prior, before and after runs, and
    is the same whatever the table holds."""
    recipe = load_recipe(RECIPE)
    levers = recipe.layout().levers()
    quick = MeasuredStack(table=str(_table(tmp_path, [_record(levers, wall=10.0, step_tps=(4000.0,) * 4)])))
    other = tmp_path / "other"
    other.mkdir()
    slow = MeasuredStack(table=str(_table(other, [_record(levers, wall=300.0, step_tps=(5.0,) * 4)])))
    before = quick.estimate_wall_time_s(recipe, 10)
    for stack in (quick, slow):
        stack.run_trial(recipe, steps=10, seed=0, workdir=tmp_path)
    assert quick.estimate_wall_time_s(recipe, 10) == before == slow.estimate_wall_time_s(recipe, 10)


def test_the_table_is_part_of_a_campaigns_identity(tmp_path, monkeypatch):
    """Resumed against another table, or the same file changed, a campaign would mix two worlds: the
    table named by ATTUNE_MEASURED_TABLE and its digest are stack options, so the identity differs,
    and a campaign whose saved digest no longer matches its file is refused in one line."""
    from attune.campaign.context import CampaignSettings
    recipe = load_recipe(RECIPE)
    levers = recipe.layout().levers()
    first = _table(tmp_path, [_record(levers)])
    monkeypatch.setenv("ATTUNE_MEASURED_TABLE", str(first))
    a = CampaignSettings.of(budget_gpu_hours=0.1, stack="measured")
    assert a.stack_options["table"] == str(first.resolve()) and len(a.stack_options["table_sha256"]) == 16
    first.write_text(first.read_text().replace("420.0", "421.0"))
    b = CampaignSettings.of(budget_gpu_hours=0.1, stack="measured")
    assert a.identity() != b.identity()
    with pytest.raises(InputError, match="changed since the campaign started"):
        CampaignSettings.of(budget_gpu_hours=0.1, stack="measured", stack_options=a.stack_options)


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
        assert all(table.runs(layout.levers()) for layout in iter_layouts(recipe))     # every layout measured
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


def test_the_cpu_benchmark_reports_every_world_as_json():
    """`bench_cpu_hardware.py report --json`: per world its measured oracle's gain and, per planner
    that ran there, the scores (none here: the report reads the rows a `campaigns` run saved)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_cpu_hardware.py"), "report", "--worlds",
                          "seq128,seq128-tight", "--json", "--out", str(REPO / ".attune" / "test-cpu-report")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    payload = json.loads(out.stdout)
    worlds = payload["worlds"]
    assert payload["code"]["changed_during_run"] is False and len(payload["code"]["digest"]) == 16
    assert [w["name"] for w in worlds] == ["seq128", "seq128-tight"]
    assert all(w["oracle_gain"] > 1.0 and w["planners"] == {} and w["frozen"] is False for w in worlds)
    assert "measured oracle" in out.stderr


def test_the_cpu_benchmark_runs_an_ablation_as_attune_with_one_rule_off(tmp_path):
    import importlib.util

    from attune.planners.attune_planner import SEARCH_RULES
    spec = importlib.util.spec_from_file_location("bench_cpu_hardware", REPO / "benchmarks" / "bench_cpu_hardware.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    one = bench.planner_variants("bayes-warm,attune-no-payback-stop")
    assert [(v.label, v.planner, v.disabled_rules) for v in one] == [
        ("bayes-warm", "bayes-warm", ()), ("attune-no-payback-stop", "attune", ("payback-stop",))]
    every = bench.planner_variants("attune", ablations=True)
    assert [v.disabled_rules for v in every] == [()] + [(rule,) for rule in SEARCH_RULES]
    import subprocess
    import sys
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_cpu_hardware.py"), "campaigns",
                          "--planners", "attune-no-bogus", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown rule 'bogus'" in out.stderr
    assert not (tmp_path / "out").exists()   # refused before anything is written
