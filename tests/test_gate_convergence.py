"""Convergence check on synthetic curves folders: band calibration, pairing, sequential, evidence, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attune.errors import InputError
from attune.gate import check_convergence
from attune.gate.curves import read_curves, write_curve
from attune.gate.step1 import step1_checks

T = 40


def _curve(rng, scale=1e-3, drift=0.0, order=0):
    t = np.arange(1, T + 1)
    batch = np.random.default_rng(100 + order).normal(0, 0.02, T)   # batch-to-batch noise of a data order
    walk = np.cumsum(rng.normal(0, scale, T)) * np.sqrt(t / T)     # run-to-run (chaotic) divergence
    loss = 3.0 * np.exp(-t / 15) + 1.0 + batch + walk + drift * t / T
    evals = 3.0 * np.exp(-t / 15) + 1.05 + walk + drift * t / T + batch / 4
    return loss, evals


def _step1(grad_norm=2.0, lr=1e-3, jitter=0.0, rng=None):
    j = (rng.normal(0, jitter) if rng is not None else 0.0)
    return {"forward_loss": 3.5, "grad_norm": grad_norm * (1 + j), "post_clip_norm": min(1.0, grad_norm),
            "max_norm": 1.0, "lr": lr, "update_norm": 0.2 * (1 + j), "eval_after_update": 3.4,
            "group_grad_norms": {"attn": grad_norm * 0.6 * (1 + j), "mlp": grad_norm * 0.8},
            "group_update_norms": {"attn": 0.1, "mlp": 0.15}, "valid_tokens": 1000, "dropped_tokens": 0}


def make_folder(path, k=3, drift=0.0, orders=None, cand_order=0, hashes=True, seed=0, step1=True,
                cand_step1=None, steps=T):
    rng = np.random.default_rng(seed)
    orders = orders or [0] * k
    path.mkdir(parents=True, exist_ok=True)
    runs = [(f"baseline-{i + 1}", o, 0.0) for i, o in enumerate(orders)] + [("candidate", cand_order, drift)]
    for name, order, d in runs:
        loss, evals = _curve(rng, drift=d, order=order)
        rows = [{"step": s + 1, "loss": loss[s], "eval_loss": evals[s]} for s in range(steps)]
        if hashes:
            for s, row in enumerate(rows):
                row["batch_hash"] = f"o{order}s{s}"
        record = None
        if step1:
            record = cand_step1 if (name == "candidate" and cand_step1) else _step1(jitter=1e-5, rng=rng)
        write_curve(path / f"{name}.csv", rows, record)
    return path


def test_replicate_like_candidate_passes_and_writes_evidence(tmp_path):
    v = check_convergence(make_folder(tmp_path / "c"), tmp_path / "out")
    assert v.passed is True, v.fired
    assert v.mode == "paired" and v.replicates == 3 and v.steps_used == T
    assert (tmp_path / "out" / "gate.png").is_file() and v.plot.endswith("gate.png")
    assert set(v.band) == {"loss", "eval_loss"} and len(v.band["loss"]["halfwidth"]) == T
    assert {"name", "value", "tolerance", "ratio"} <= set(v.statistic)
    assert json.dumps(v.model_dump(mode="json"))


def test_systematic_drift_fails_on_the_whole_curve(tmp_path):
    v = check_convergence(make_folder(tmp_path / "c", drift=0.3))
    assert v.passed is False
    assert any(n.startswith("curve.") for n in v.fired)


def test_small_drift_near_the_edge_is_inconclusive_and_says_how_many_steps(tmp_path):
    found = None
    for drift in np.arange(0.0, 0.08, 0.0025):
        v = check_convergence(make_folder(tmp_path / f"d{drift:.4f}", drift=float(drift), seed=3), plot=False)
        if v.verdict == "inconclusive":
            found = v
            break
    assert found is not None, "no drift landed near the band's edge"
    assert found.passed is False                       # never null: inconclusive is not passed
    assert found.need_more_steps > T and f"about {found.need_more_steps} steps" in found.reason
    assert json.loads(found.model_dump_json())["verdict"] == "inconclusive"
    # the gate's own runs: the sequential rule doubles, and at its bound an inside-the-limit candidate passes
    more = check_convergence(tmp_path / f"d{drift:.4f}", max_steps=4 * T, plot=False)
    assert more.verdict == "inconclusive" and more.need_more_steps == 2 * T
    at_bound = check_convergence(tmp_path / f"d{drift:.4f}", max_steps=T, plot=False)
    assert at_bound.verdict == "passed" and at_bound.need_more_steps is None


def test_other_data_order_pairs_with_its_replicates_not_rejected(tmp_path):
    folder = make_folder(tmp_path / "c", orders=[0, 0, 1, 1], cand_order=1)
    v = check_convergence(folder)
    assert v.passed is True, v.fired
    assert v.mode == "paired" and v.paired_with == ["baseline-3", "baseline-4"]


def test_batches_no_replicate_saw_fail_data_identity(tmp_path):
    v = check_convergence(make_folder(tmp_path / "c", cand_order=7))
    assert v.passed is False and "data.identity" in v.fired


def test_without_hashes_the_band_is_unpaired(tmp_path):
    v = check_convergence(make_folder(tmp_path / "c", hashes=False, orders=[0, 1, 2], cand_order=3))
    assert v.mode == "unpaired" and v.passed is True, v.fired


def test_step1_gradient_scale_fault_fails_even_with_identical_curves(tmp_path):
    folder = make_folder(tmp_path / "c", cand_step1=_step1(grad_norm=4.0))
    v = check_convergence(folder)
    assert v.passed is False
    assert "step1.grad_norm" in v.fired


def test_step1_checks_are_calibrated_from_replicates():
    rng = np.random.default_rng(0)
    reps = [_step1(jitter=1e-2, rng=rng) for _ in range(3)]
    ok = step1_checks(_step1(jitter=1e-2, rng=rng), reps, "exact")
    assert all(c.passed for c in ok if c.name == "step1.grad_norm")
    bad = step1_checks(_step1(grad_norm=2.4), reps, "exact")
    assert not next(c for c in bad if c.name == "step1.grad_norm").passed
    lr = step1_checks(_step1(lr=2e-3), reps, "exact")
    assert not next(c for c in lr if c.name == "step1.lr").passed


def test_post_clip_invariant():
    record = _step1() | {"grad_norm": 3.0, "post_clip_norm": 1.7}
    checks = step1_checks(record, [_step1(), _step1()], "exact")
    assert not next(c for c in checks if c.name == "invariant.post_clip_norm").passed


def test_step_loss_only_files_are_valid(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    for name in ("baseline-1", "baseline-2", "candidate"):
        (folder / f"{name}.csv").write_text("step,loss\n" + "".join(f"{s},{3 - s / 100}\n" for s in range(1, 21)))
    v = check_convergence(folder)
    assert v.passed is True and list(v.band) == ["loss"]
    assert "step-1 checks skipped" in v.reason


@pytest.mark.parametrize("breakage, needle", [
    ("missing_candidate", "candidate.csv"), ("one_baseline", "two baseline"),
    ("short", "different length"), ("header", "step,loss"), ("column", "unknown column"),
    ("gap", "baseline-2.csv"), ("nan", "diverged"), ("no_folder", "not found")])
def test_bad_curves_are_one_clear_input_error(tmp_path, breakage, needle):
    folder = make_folder(tmp_path / "c")
    if breakage == "missing_candidate":
        (folder / "candidate.csv").unlink()
    elif breakage == "one_baseline":
        for i in (2, 3):
            (folder / f"baseline-{i}.csv").unlink()
    elif breakage == "short":   # two steps in common: nothing to compare (a few fewer are aligned)
        lines = (folder / "candidate.csv").read_text().splitlines()
        (folder / "candidate.csv").write_text("\n".join(lines[:3]) + "\n")
    elif breakage == "header":
        (folder / "baseline-1.csv").write_text("iter,value\n1,2\n")
    elif breakage == "column":
        text = (folder / "baseline-1.csv").read_text().replace("step,loss", "step,loss,bogus", 1)
        (folder / "baseline-1.csv").write_text(text)
    elif breakage == "gap":
        (folder / "baseline-2.csv").unlink()
    elif breakage == "nan":
        lines = (folder / "baseline-2.csv").read_text().splitlines()
        cells = lines[5].split(",")
        cells[1] = "nan"
        lines[5] = ",".join(cells)
        (folder / "baseline-2.csv").write_text("\n".join(lines) + "\n")
    elif breakage == "no_folder":
        folder = tmp_path / "nowhere"
    with pytest.raises(InputError) as err:
        read_curves(folder)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_recompute_routing_invariant():
    checks = step1_checks(_step1() | {"recompute_mismatch": 3}, [_step1(), _step1()], "exact")
    assert not next(c for c in checks if c.name == "invariant.recompute_routing").passed
    clean = step1_checks(_step1() | {"recompute_mismatch": 0}, [_step1(), _step1()], "exact")
    assert next(c for c in clean if c.name == "invariant.recompute_routing").passed


def test_verdict_is_never_null():
    from attune.gate.models import ConvergenceVerdict, GateReport
    old = ConvergenceVerdict.model_validate({"passed": None, "need_more_steps": 80, "reason": "r", "mode": "paired",
                                             "steps_used": 40, "replicates": 3})
    assert old.verdict == "inconclusive" and old.passed is False
    with pytest.raises(ValueError):
        ConvergenceVerdict(passed=True, verdict="inconclusive", reason="r", mode="paired", steps_used=1, replicates=2)
    assert GateReport.model_fields["verdict"].annotation is not None
    assert not bool(GateReport.model_validate({"passed": False, "verdict": "inconclusive",
                                               "config": {"passed": True}}).model_dump()["passed"])


def test_batch_id_column_pairs_exactly_and_both_ids_are_refused(tmp_path):
    folder = make_folder(tmp_path / "c", orders=[0, 0, 1, 1], cand_order=1)
    for path in folder.glob("*.csv"):
        path.write_text(path.read_text().replace("batch_hash", "batch_id", 1))
    v = check_convergence(folder, plot=False)
    assert v.pairing == "batch_ids" and v.paired_with == ["baseline-3", "baseline-4"] and v.passed
    text = (folder / "candidate.csv").read_text().splitlines()
    (folder / "candidate.csv").write_text("\n".join([text[0] + ",batch_hash"] + [r + ",x" for r in text[1:]]) + "\n")
    with pytest.raises(InputError, match="not both"):
        read_curves(folder)


def test_pairing_inferred_without_hashes(tmp_path):
    folder = make_folder(tmp_path / "c", orders=[0, 0, 1, 1], cand_order=1, hashes=False)
    v = check_convergence(folder, plot=False)
    assert v.pairing == "inferred" and v.paired_with == ["baseline-3", "baseline-4"] and v.passed, v.fired
    off = check_convergence(folder, infer_pairing=False, plot=False)
    assert off.mode == "unpaired" and off.pairing == "none"
