"""The nightly re-tune's domain without a server: registry, fingerprints, the regression call, the
decision in words, the ledger in a real folder store, the markdown."""

from __future__ import annotations

import os
import re
import stat
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, RECIPE_8B

from attune.errors import InputError
from attune.nightly import decide, fingerprint, report, shipped
from attune.nightly.ledger import NightRecord, OpenRegression, last_record, write_record
from attune.nightly.regression import judge
from attune.nightly.registry import load_registry
from attune.recipe import load_recipe
from attune.store import entry_for_recipe, open_store

STACK_A = {"torch": "2.13.0", "torchtitan": "0.3.0"}
STACK_B = {"torch": "2.14.0", "torchtitan": "0.3.0", "cuda": "12.8"}


def _registry(tmp_path: Path, body: str) -> Path:
    (tmp_path / "r.toml").write_text(textwrap.dedent(RECIPE_8B))
    path = tmp_path / "prod.toml"
    path.write_text(textwrap.dedent(body))
    return path


def test_the_production_registry_loads_with_its_defaults():
    reg = load_registry(REPO / "deployments" / "production.toml")
    names = [r.name for r in reg.recipes]
    assert len(names) == len(set(names)) >= 2
    assert all(Path(r.path).is_file() and r.budget_gpu_hours > 0 for r in reg.recipes)
    enabled = reg.selected()
    assert enabled and all(r.stack == "sim" for r in enabled)   # the disabled one is the real-GPU example
    real = [r for r in reg.recipes if r.stack == "torchtitan"]
    assert real and real[0].pool == "attune-gpu-k8s" and not real[0].enabled
    from attune.nightly.measure import estimated_cost
    from attune.campaign.inputs import load_campaign_recipe

    for r in enabled:  # each loads on its production cluster, and a night can pay for its re-measure
        recipe = load_campaign_recipe(r.path, r.cluster)
        assert recipe.cluster.label == r.cluster and estimated_cost(r, recipe) < r.budget_gpu_hours / 2


def test_registry_paths_are_relative_to_it_and_defaults_apply(tmp_path):
    reg = load_registry(_registry(tmp_path, """
        [defaults]
        budget_gpu_hours = 12
        [[recipe]]
        name = "a"
        path = "r.toml"
        [[recipe]]
        name = "b"
        path = "r.toml"
        budget_gpu_hours = 30
        gpu_pool = "big"
        """))
    a, b = reg.recipes
    assert a.path == str((tmp_path / "r.toml").resolve()) and a.budget_gpu_hours == 12 and a.pool == "sim"
    assert b.budget_gpu_hours == 30 and b.pool == "big"
    assert [r.name for r in reg.selected(["b"])] == ["b"]
    with pytest.raises(InputError, match="not in"):
        reg.selected(["zzz"])


@pytest.mark.parametrize("body, needle", [
    ('[[recipe]]\nname = "a"\npath = "nope.toml"\nbudget_gpu_hours = 1\n', "recipe file not found"),
    ('[[recipe]]\nname = "a"\npath = "r.toml"\n', "budget_gpu_hours"),
    ('[[recipe]]\nname = "a/b"\npath = "r.toml"\nbudget_gpu_hours = 1\n', "name"),
    ('[[recipe]]\nname = "a"\npath = "r.toml"\nbudget_gpu_hours = 1\nbudget = 3\n', "unknown key"),
    ('[[recipe]]\nname = "a"\npath = "r.toml"\nbudget_gpu_hours = 1\n' * 2, "unique"),
    ('store = "x"\n', "[[recipe]]"),
])
def test_bad_registries_say_which_field(tmp_path, body, needle):
    with pytest.raises(InputError, match=re.escape(needle)):
        load_registry(_registry(tmp_path, body))


def test_sim_fingerprint_is_the_recipes_stack_section(write_recipe):
    recipe = load_recipe(write_recipe())
    assert fingerprint.detect_stack("sim", recipe) == recipe.stack


def test_environment_versions_read_torch_torchtitan_and_the_driver(tmp_path, monkeypatch):
    # a fake nvidia-smi on PATH: what a GPU node answers
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 560.35.03\necho 560.35.03\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    import torch

    versions = fingerprint.environment_versions()
    assert versions["torch"] == torch.__version__.split("+")[0]
    assert versions["torchtitan"].startswith("0.3")
    assert versions["driver"] == "560.35.03"
    assert ("cuda" in versions) == bool(torch.version.cuda)
    spec = fingerprint.detect_stack("torchtitan", load_recipe(REPO / "recipes/public/llama3_8b.toml"))
    assert spec.driver == "560.35.03" and spec.fingerprint() != load_recipe(
        REPO / "recipes/public/llama3_8b.toml").stack.fingerprint()


def test_no_nvidia_smi_means_no_driver_field(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert fingerprint.driver_version() is None
    assert "driver" not in fingerprint.environment_versions(nvidia_smi=lambda: None)


def test_stack_changes_in_words():
    assert fingerprint.stack_changes(STACK_A, STACK_B) == ["torch 2.13.0 -> 2.14.0", "cuda (none) -> 12.8"]
    assert fingerprint.stack_changes(STACK_A, STACK_A) == []


def test_regression_needs_more_than_the_noise_band():
    noisy = judge([900.0, 1000.0, 1100.0], ["ok"] * 3, 1050.0, "f", 1.0)
    assert not noisy.regressed and noisy.band > 0.1           # 10% spread: a -5% change is noise
    tight = judge([900.0, 901.0, 899.0], ["ok"] * 3, 1000.0, "f", 1.0)
    assert tight.regressed and tight.change == pytest.approx(-0.1) and tight.band == pytest.approx(0.02)
    tiny = judge([995.0, 995.0, 995.0], ["ok"] * 3, 1000.0, "f", 1.0, floor=0.02)
    assert not tiny.regressed                                   # below the floor, whatever the noise
    dead = judge([], ["oom", "oom"], 1000.0, "f", 1.0)
    assert dead.regressed and dead.mean_tps is None and "oom" in dead.why


def _entry(recipe, tps=1000.0, stack=None, at="2026-11-30T02:00:00+00:00"):
    if stack is not None:
        recipe = recipe.model_copy(update={"stack": recipe.stack.model_validate(stack)})
    return entry_for_recipe(recipe, tokens_per_sec_per_gpu=tps, gate_passed=True, simulated=True, measured_at=at)


def test_last_shipped_is_the_newest_entry_for_model_and_cluster(tmp_path, write_recipe):
    recipe = load_recipe(write_recipe())
    store = open_store(str(tmp_path / "store"))
    store.put(_entry(recipe, 1000.0, STACK_A, "2026-11-01T02:00:00+00:00"))
    store.put(_entry(recipe, 900.0, STACK_B, "2026-11-20T02:00:00+00:00"))
    found = shipped.last_shipped(store, recipe.model_name, recipe.cluster.label)
    assert found.stack["torch"] == "2.14.0" and found.tokens_per_sec_per_gpu == 900.0
    assert shipped.last_shipped(store, recipe.model_name, "h200:8") is None
    assert shipped.clusters_shipped(store, recipe.model_name) == [recipe.cluster.label]


def test_decisions_in_words(write_recipe):
    recipe = load_recipe(write_recipe())
    entry = _entry(recipe, stack=STACK_A)
    ref = decide.reference(entry, None, recipe.cluster.label)
    fp_a, fp_b = entry.stack_fingerprint, recipe.stack.model_validate(STACK_B).fingerprint()
    model, cluster = recipe.model_name, recipe.cluster.label
    assert decide.changes(ref, fp_a, STACK_A, model, cluster, [cluster]) == []
    changed = decide.changes(ref, fp_b, STACK_B, model, cluster, [cluster])
    assert "stack changed" in changed[0] and "torch 2.13.0 -> 2.14.0" in changed[0]
    assert "no shipped recipe" in decide.changes(None, fp_a, STACK_A, model, cluster, [])[0]
    assert "cluster changed" in decide.changes(None, fp_a, STACK_A, model, "h200:8", [cluster])[0]

    fine = judge([1000.0, 1001.0], ["ok"] * 2, 1000.0, fp_a, 1.0)
    slow = judge([800.0, 801.0], ["ok"] * 2, 1000.0, fp_a, 1.0)
    assert decide.decide([], fine, None, fp_a)[0] is False
    assert decide.decide(changed, fine, None, fp_b)[0] is True
    tune, why = decide.decide([], slow, None, fp_a)
    assert tune and why.startswith("regression") and "-20.0%" in why
    # a regression already re-tuned on this stack: stays failed, spends nothing more
    last = NightRecord(recipe="a", night="2026-12-01", model=model, cluster=cluster, fingerprint=fp_a, stack=STACK_A,
                       open_regression=OpenRegression(since="2026-11-30", fingerprint=fp_a, change=-0.2,
                                                      retuned_night="2026-12-01"))
    tune, why = decide.decide([], slow, last, fp_a)
    assert not tune and "still regressed since 2026-11-30" in why
    standing = decide.open_regression(slow, False, last, fp_a, "2026-12-02", tuned=False)
    assert standing.since == "2026-11-30" and standing.retuned_night == "2026-12-01"
    assert decide.open_regression(slow, True, last, fp_a, "2026-12-02", tuned=True) is None


def test_a_campaign_that_kept_the_baseline_counts_as_tuned(write_recipe):
    """The ledger's later campaign is the reference, so a kept baseline is not re-tuned every night."""
    recipe = load_recipe(write_recipe())
    entry = _entry(recipe, stack=STACK_A, at="2026-11-01T02:00:00+00:00")
    fp_b = recipe.stack.model_validate(STACK_B).fingerprint()
    last = NightRecord(recipe="a", night="2026-12-01", model=recipe.model_name, cluster=recipe.cluster.label,
                       fingerprint=fp_b, stack=STACK_B, action="tuned", tuned_fingerprint=fp_b, tuned_stack=STACK_B,
                       tuned_at="2026-12-01T03:00:00+00:00")
    ref = decide.reference(entry, last, recipe.cluster.label)
    assert ref.source == "ledger" and ref.fingerprint == fp_b
    assert decide.changes(ref, fp_b, STACK_B, recipe.model_name, recipe.cluster.label, []) == []


def test_ledger_round_trip_and_markdown(tmp_path):
    store = open_store(str(tmp_path / "store"))
    assert last_record(store, "a") is None
    slow = judge([800.0, 801.0], ["ok"] * 2, 1000.0, "aaaa", 1.5)
    record = NightRecord(recipe="a", night="2026-12-02", model="llama3.1-8b", cluster="h100:8", fingerprint="bbbb",
                         stack=STACK_B, remeasure=slow, action="tuned", why="regression: ...",
                         changes=["stack changed (aaaa -> bbbb): torch 2.13.0 -> 2.14.0"],
                         campaign={"campaign_id": "c1", "shipped": False, "trials": 5, "gpu_hours_used": 3.0,
                                   "stop_reason": "converged; kept the baseline recipe", "mlflow_run_id": "r1"},
                         open_regression=OpenRegression(since="2026-12-02", fingerprint="bbbb", change=slow.change,
                                                        retuned_night="2026-12-02"))
    write_record(store, record)
    again = last_record(store, "a")
    assert again.failed and again.remeasure.change == pytest.approx(-0.1995) and again.at
    assert (tmp_path / "store" / "nightly" / "a" / "2026-12-02.json").is_file()
    md = report.regression_markdown(again)
    assert "-20.0%" in md and "torch 2.13.0 -> 2.14.0" in md and "kept the baseline" in md
    summary = report.summary_markdown("2026-12-02", "prod.toml", [again])
    assert "REGRESSION -20.0%" in summary and "| a | h100:8 |" in summary
