"""gate.verify: config first, then proxy curves, the convergence check and the files it leaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attune import gate
from attune.layout import apply_levers
from attune.recipe import load_recipe
from attune.gate.pipeline import plan_runs
from tests.conftest import RECIPE_8B


SMALL_CLUSTER = RECIPE_8B.replace("gpus = 8", "gpus = 2")


@pytest.fixture
def base(write_recipe):
    return load_recipe(write_recipe(SMALL_CLUSTER))  # llama3.1-8b on 2 H100 (proxy: 2 DP ranks), selective AC


def _moved(recipe, moves):
    return recipe.with_config(apply_levers(recipe.config, moves, recipe.architecture, recipe.cluster))


def test_config_failure_runs_no_proxy(base, tmp_path):
    bad = base.with_config(dict(base.config) | {"optimizer.lr": 1e-3})
    report = gate.verify(base, bad, tmp_path / "w")
    assert report.passed is False and report.convergence is None
    assert not (tmp_path / "w" / "curves").exists()
    assert report.model_dump()["config"]["violations"][0]["field"] == "optimizer.lr"


def test_layout_change_adds_replicates_under_the_candidate_data_order(base):
    tp2 = _moved(base, {"parallelism.tensor_parallel_degree": 2})
    plan = plan_runs(base, tp2, steps=4, replicates=3, seed=0)
    orders = [cfg.data_order for name, cfg in plan.items() if name != "candidate"]
    assert orders == [2, 2, 2, 1, 1] and plan["candidate"].data_order == 1
    same = plan_runs(base, _moved(base, {"activation_checkpoint.mode": "full"}), steps=4, replicates=3, seed=0)
    assert len(same) == 4


def test_verify_writes_curves_plot_and_report(base, tmp_path):
    candidate = _moved(base, {"activation_checkpoint.mode": "full"})
    report = gate.verify(base, candidate, tmp_path / "w", steps=3, replicates=2)
    dumped = report.model_dump(mode="json")
    assert set(dumped) >= {"passed", "config", "convergence", "steps_used", "plot"}
    assert report.passed is True, report.convergence.fired
    assert report.steps_used == 3 and report.plot.endswith("gate.png")
    curves = tmp_path / "w" / "curves"
    assert sorted(p.name for p in curves.glob("*.csv")) == ["baseline-1.csv", "baseline-2.csv", "candidate.csv"]
    assert (curves / "candidate.step1.json").is_file()
    assert json.loads((curves / "manifest.json").read_text())["tier"] == "exact"
    assert not list((tmp_path / "w").glob(".*tmp*"))
    assert json.dumps(dumped)


def test_replicates_must_be_two_or_more(base, tmp_path):
    with pytest.raises(ValueError):
        gate.verify(base, base, tmp_path, replicates=1)


def test_curves_only_failure_is_confirmed_by_an_independent_run(base, tmp_path, monkeypatch):
    import attune.gate.pipeline as pipeline
    from attune.gate.config_check import check_config
    from attune.gate.models import Check, ConvergenceVerdict

    seen = []

    def fake_check(folder, out, max_steps=None):
        noise = json.loads((folder / "runs.json").read_text())["candidate"]["noise_seed"]
        seen.append(noise)
        failed = noise == pipeline.CANDIDATE_NOISE
        return ConvergenceVerdict(passed=not failed, reason="r", mode="paired", steps_used=3, replicates=2,
                                  statistic={"name": "curve.loss.sup", "ratio": 1.5}, fired=["curve.loss.sup"] * failed,
                                  checks=[Check(name="curve.loss.sup", kind="curve", passed=not failed)])

    monkeypatch.setattr(pipeline, "check_convergence", fake_check)
    candidate = _moved(base, {"activation_checkpoint.mode": "full"})
    verdict = pipeline.converge(base, candidate, check_config(base, candidate), tmp_path, 3, 2, 0)
    assert seen == [pipeline.CANDIDATE_NOISE, pipeline.CONFIRM_NOISE]
    assert verdict.passed is True and verdict.reason.startswith("confirmation run")


def test_cached_verdicts_are_keyed_by_the_gate_code(tmp_path):
    """A verdict cached by an older gate is never reused: the key holds a digest of the gate's code."""
    from attune.gate.pipeline import code_version
    version = code_version()
    assert len(version) == 12 and version == code_version()
    probe = Path(__file__).resolve().parent.parent / "gate" / "_version_probe.py"
    probe.write_text("# a change to the gate\n")
    try:
        code_version.cache_clear()
        assert code_version() != version
    finally:
        probe.unlink()
        code_version.cache_clear()
    assert code_version() == version
