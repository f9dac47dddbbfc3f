"""`attune gate`: both command forms, JSON shape, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attune.cli.main import main
from tests.conftest import RECIPE_8B
from tests.test_gate_convergence import make_folder

CANDIDATE = RECIPE_8B.replace('"activation_checkpoint.mode" = "selective"', '"activation_checkpoint.mode" = "full"')
LR_CHANGED = RECIPE_8B.replace('"optimizer.lr" = 3e-4', '"optimizer.lr" = 6e-4')


@pytest.fixture
def pair(write_recipe):
    return write_recipe(RECIPE_8B, "a.toml"), write_recipe(CANDIDATE, "b.toml")


def run(capsys, *args) -> tuple[int, str, str]:
    """The CLI in-process (the subprocess tests below cover the real entry point)."""
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_config_only_bare_form_as_a_real_process(cli, pair):
    a, b = pair
    proc = cli("gate", "--baseline", a, "--candidate", b, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["passed"] is True and out["convergence"] is None


@pytest.mark.parametrize("form", [[], ["check"]])
def test_config_only_both_forms(capsys, pair, form):
    a, b = pair
    code, stdout, _ = run(capsys, "gate", *form, "--baseline", a, "--candidate", b, "--json")
    assert code == 0
    out = json.loads(stdout)
    assert out["passed"] is True and out["convergence"] is None
    assert set(out["config"]) >= {"passed", "violations", "defects", "numerics_change"}
    assert "config check only" in out["note"]


def test_objective_change_fails_with_the_field_named(capsys, write_recipe):
    a, b = write_recipe(RECIPE_8B, "a.toml"), write_recipe(LR_CHANGED, "b.toml")
    code, stdout, _ = run(capsys, "gate", "--baseline", a, "--candidate", b, "--json")
    assert code == 1
    out = json.loads(stdout)
    assert out["passed"] is False
    assert out["config"]["violations"][0]["field"] == "optimizer.lr" and out["config"]["violations"][0]["reason"]


def test_with_curves_runs_the_convergence_check(capsys, pair, tmp_path):
    a, b = pair
    folder = make_folder(tmp_path / "curves")
    before = sorted(p.name for p in folder.iterdir())
    code, stdout, _ = run(capsys, "gate", "--baseline", a, "--candidate", b, "--curves", folder, "--json",
                          "--out", tmp_path / "out")
    assert code == 0
    conv = json.loads(stdout)["convergence"]
    assert conv["passed"] is True and conv["steps_used"] == 40 and conv["plot"].endswith("gate.png")
    assert conv["band"]["loss"]["halfwidth"] and conv["statistic"]["name"]
    # the plot goes beside the report, where --out says; the user's curves folder is only read
    assert Path(conv["plot"]) == tmp_path / "out" / "gate.png" and Path(conv["plot"]).is_file()
    assert json.loads((tmp_path / "out" / "gate_report.json").read_text())["passed"] is True
    assert sorted(p.name for p in folder.iterdir()) == before


def test_text_output(capsys, pair):
    a, b = pair
    code, stdout, _ = run(capsys, "gate", "--baseline", a, "--candidate", b)
    assert code == 0 and stdout.startswith("gate: PASS")


@pytest.mark.parametrize("case", ["missing_recipe", "missing_curve", "short_curve", "unknown_column",
                                  "unknown_recipe_key", "eval_with_baseline", "check_with_quick",
                                  "no_candidate", "unknown_case", "unknown_suite", "noise_on_proxy",
                                  "unknown_noise", "unknown_historical_case"])
def test_bad_input_is_one_line_and_exit_2(capsys, pair, tmp_path, write_recipe, case):
    a, b = pair
    folder = make_folder(tmp_path / "curves")
    args, needle = ["gate", "--baseline", a, "--candidate", b, "--curves", folder, "--json"], None
    if case == "missing_recipe":
        args[4], needle = str(tmp_path / "nope.toml"), "recipe file not found"
    elif case == "missing_curve":
        (folder / "candidate.csv").unlink()
        needle = "curve file not found"
    elif case == "short_curve":   # fewer than 3 steps in common (a few fewer are aligned, not refused)
        lines = (folder / "candidate.csv").read_text().splitlines()
        (folder / "candidate.csv").write_text("\n".join(lines[:3]) + "\n")
        needle = "different length"
    elif case == "unknown_column":
        text = (folder / "candidate.csv").read_text().replace("step,loss", "step,loss,mystery", 1)
        (folder / "candidate.csv").write_text(text)
        needle = "unknown column"
    elif case == "unknown_recipe_key":
        args[4], needle = str(write_recipe("bogus = 1\n" + RECIPE_8B, "bad.toml")), "bogus"
    elif case == "eval_with_baseline":
        args, needle = ["gate", "eval", "--baseline", a], "--baseline"
    elif case == "check_with_quick":
        args, needle = ["gate", "--baseline", a, "--candidate", b, "--quick"], "--quick"
    elif case == "no_candidate":
        args, needle = ["gate", "--baseline", a], "--candidate"
    elif case == "unknown_case":
        args, needle = ["gate", "eval", "--only", "Z99"], "Z99"
    elif case == "unknown_suite":
        args, needle = ["gate", "eval", "--stack", "torchtitan", "--suite", "modern"], "--suite"
    elif case == "noise_on_proxy":
        args, needle = ["gate", "eval", "--noise", "gpu-like"], "--noise"
    elif case == "unknown_noise":
        args, needle = ["gate", "eval", "--stack", "torchtitan", "--noise", "loud"], "--noise"
    elif case == "unknown_historical_case":   # a torchtitan-suite id is not a historical case
        args, needle = ["gate", "eval", "--stack", "torchtitan", "--suite", "historical", "--only",
                        "T-F01_lr_doubled"], "T-F01_lr_doubled"
    code, stdout, stderr = run(capsys, *args)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attune: error:"), stderr
    assert needle in stderr and "Traceback" not in stderr and not stdout


def test_eval_subset_reports_cases(capsys):
    code, stdout, _ = run(capsys, "gate", "eval", "--only", "C01_lr_changed,F06_lr_x2", "--quick", "--steps", "3",
                          "--json")
    assert code == 0
    out = json.loads(stdout)
    assert (out["faults"], out["caught"], out["legit"], out["false_rejects"]) == (2, 2, 0, 0)
    by_id = {c["id"]: c for c in out["per_case"]}
    assert by_id["C01_lr_changed"]["fired"] == ["config"]
    assert "step1" in by_id["F06_lr_x2"]["fired"]


@pytest.mark.slow
def test_eval_quick(cli):
    proc = cli("gate", "eval", "--quick", "--json", timeout=1800)
    out = json.loads(proc.stdout)
    assert out["false_rejects"] == 0 and out["caught"] == out["faults"], out


@pytest.mark.slow
def test_eval_full_suite(cli):
    proc = cli("gate", "eval", "--json", "--workers", "2", timeout=7200)
    out = json.loads(proc.stdout)
    assert out["faults"] >= 24 and out["legit"] >= 12
    assert out["false_rejects"] == 0 and out["caught"] >= 22, out
