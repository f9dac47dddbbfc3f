"""The historical suite (gate/suite_historical.toml: real silent-correctness bugs restored in
torchtitan) and GPU-like replicate noise for the torchtitan gate runs. The fast tests run each
override's buggy piece on a tiny object (no training); one real torchtitan run is slow."""

from __future__ import annotations

import json
import math

import pytest

from attune.gate.evaluate import (CaseResult, EvalReport, base_recipe, case_base, case_recipe, historical_bugs,
                                  historical_table, suite)
from attune.gate.config_check import check_config
from attune.gate.torchtitan_runs import (CANDIDATE_NOISE_SEED, NOISE_LEVELS, NOISE_REPLICATES, REPLICATES,
                                         override_import, plan_runs)
from attune.stacks.torchtitan.validate import torchtitan_available

needs_torchtitan = pytest.mark.skipif(not torchtitan_available(), reason="torchtitan is not installed")
CASES = suite("historical")["cases"]


def test_every_case_names_a_researched_bug_with_its_links():
    bugs = historical_bugs()
    assert len([c for c in CASES if c["kind"] == "fault"]) >= 8 and len(CASES) >= 12
    for case in (c for c in CASES if c["kind"] != "legit"):
        bug = bugs[case["bug"]]
        assert bug["cpu_feasible"] is True and case["kind"] in ("fault", "control")
        if bug.get("found_here"):   # a bug of the installed stack this suite found: nothing to inject
            assert bug["tracker"].startswith("none: found by this suite") and not case.get("faults")
        else:
            assert bug["tracker"].startswith("https://github.com/") and case["faults"]
    # the three pipeline bugs are restored, each at PP 2 (beside the ZBV bug this suite found)
    piped = {c["bug"] for c in CASES if c.get("moves", {}).get("parallelism.pipeline_parallel_degree") == 2
             and c["kind"] == "fault"}
    assert piped == {"TT-1733", "TT-596", "TT-2972", "AT-ZBV-NORM"}


def test_the_suite_carries_legitimate_changes_a_pipelined_one_among_them():
    """A gate that refused everything would catch every bug; the legitimate cases are what it must pass."""
    legit = [c for c in CASES if c["kind"] == "legit"]
    assert len(legit) >= 2 and all(not c.get("faults") and not c.get("bug") for c in legit)
    schedules = {c["moves"]["parallelism.pipeline_parallel_schedule"] for c in legit
                 if c["moves"].get("parallelism.pipeline_parallel_degree", 1) > 1}
    assert schedules == {"1F1B", "Interleaved1F1B", "ZBVZeroBubble"}


def test_the_cases_change_no_config_field_so_only_runs_can_catch_them():
    base = base_recipe("historical")
    for case in CASES:
        own = case_base(base, case)
        assert check_config(own, case_recipe(own, case)).passed, case["id"]
    plain = case_base(base, next(c for c in CASES if c.get("base_torchtitan")))   # another recipe of the model
    assert plain.torchtitan.config == "llama3_debugmodel_ce_loss" and plain.config == base.config
    padded = case_base(base, next(c for c in CASES if c.get("bug") == "TT-1842"))
    assert "padded_labels" in padded.config["override.imports"] and "override.imports" not in base.config


def test_a_historical_fault_resolves_to_its_module():
    assert override_import("historical_bugs.lr_scheduler_per_process") == \
        "attune.stacks.torchtitan.historical_bugs.lr_scheduler_per_process"
    assert override_import("lr_doubled") == "attune.stacks.torchtitan.faults.lr_doubled"


@needs_torchtitan
def test_every_case_fault_is_an_override_factory():
    from attune.stacks.torchtitan import historical_bugs as hb
    for case in CASES:
        for fault in case.get("faults", ()):
            module, name = fault.split(".")
            assert module == "historical_bugs" and callable(getattr(hb, name)), fault
    assert set(hb.BUGS) == {c["bug"] for c in CASES if c.get("bug")}
    assert {c["faults"][0] for c in CASES if c.get("bug") == "TT-1842"} == {"historical_bugs.loss_per_microbatch_mean"}


@needs_torchtitan
def test_resume_bugs_replay_what_the_buggy_restart_reads():
    from attune.stacks.torchtitan import historical_bugs as hb
    settings = {"steps": 20, "global_batch": 8, "order_dp": 2}
    consumed = hb.resume_step(settings) * hb.samples_per_source_step(settings)
    assert consumed == 40
    # HF-5605, G = 2: after 40 samples the stream goes back to sample 20 (half replayed), then on
    stream = list(hb.replay_after_resume(iter(range(100)), consumed, 2))
    assert stream[:40] == list(range(40)) and stream[40:60] == list(range(20, 40)) and stream[60] == 40
    # TT-3907: after 40 samples the stream starts again from the first
    stream = list(hb.restart_after_resume(lambda: iter(range(100)), consumed))
    assert stream[40:45] == [0, 1, 2, 3, 4]
    # a stream shorter than the resume point is left as it is
    assert list(hb.replay_after_resume(iter(range(5)), consumed, 2)) == list(range(5))


@needs_torchtitan
def test_lr_scheduler_steps_once_per_process(monkeypatch):
    import torch
    from torchtitan.components.optimizer import LRSchedulersContainer
    from attune.stacks.torchtitan import historical_bugs as hb
    monkeypatch.setattr(hb, "_world", lambda: 2)
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    cfg = hb.lr_scheduler_per_process(LRSchedulersContainer.Config(warmup_steps=2, decay_ratio=0.8))
    schedulers = cfg.build(optimizers=[opt], training_steps=40)
    with pytest.warns(UserWarning):      # stepped before any optimizer step: torch's warning
        schedulers.step()
    assert schedulers.schedulers[0].last_epoch == 2


@needs_torchtitan
def test_clip_bugs_change_the_norm_they_clip_with(monkeypatch):
    import torch
    from torchtitan.distributed import utils as tt_dist_utils
    from attune.stacks.torchtitan import historical_bugs as hb
    original = tt_dist_utils.clip_grad_norm_
    monkeypatch.setattr(tt_dist_utils, "clip_grad_norm_", original)  # restored after the test

    def grads():
        p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
        p.grad = torch.full((4,), 2.0, dtype=torch.float64)   # norm 4, clipped to 1
        return [p]

    # 2 replicas without a process group: the SUM all-reduce of norm^2 over them
    monkeypatch.setattr(hb, "replicated_norm_summed", lambda norm, group=None: norm * math.sqrt(2))
    hb.clip_norm_replicas_summed(None)
    params = grads()
    norm = tt_dist_utils.clip_grad_norm_(params, 1.0, foreach=True)
    assert float(norm) == pytest.approx(4 * math.sqrt(2))
    assert float(params[0].grad.norm()) == pytest.approx(1 / math.sqrt(2), rel=1e-5)  # clipped 0.71x too hard
    # PT-149768: one epsilon per rank; the coefficient moves by ~1e-6 only
    monkeypatch.setattr(hb, "_world", lambda: 2)
    monkeypatch.setattr(tt_dist_utils, "clip_grad_norm_", original)
    hb.clip_epsilon_per_rank(None)
    params = grads()
    norm = tt_dist_utils.clip_grad_norm_(params, 1.0, foreach=True)
    assert float(norm) == 4.0   # the reported norm is right
    assert float(params[0].grad.norm()) == pytest.approx(4 / (4 + 2e-6), rel=1e-12)   # torch's own: 4 / (4 + 1e-6)


@needs_torchtitan
def test_padded_labels_mask_a_sample_the_same_way_every_time():
    import torch
    from torchtitan.components.loss import IGNORE_INDEX
    from attune.stacks.torchtitan import historical_bugs as hb
    tokens = torch.arange(128) * 7 % 2048
    first, again = hb.pad_labels(({"input": tokens}, tokens.clone())), hb.pad_labels(({"input": tokens}, tokens.clone()))
    valid = int((first[1] != IGNORE_INDEX).sum())
    assert hb.MIN_VALID <= valid <= 128 and torch.equal(first[1], again[1])
    lengths = {hb.valid_length(torch.randint(0, 2048, (128,), generator=torch.Generator().manual_seed(i)), 128)
               for i in range(20)}
    assert len(lengths) > 5   # examples of many lengths: what makes per-micro-batch means differ


@needs_torchtitan
def test_gpu_like_noise_is_seeded_and_of_its_size():
    import torch
    from attune.stacks.torchtitan.recorder import perturb_grads

    def perturbed(seed):
        p = torch.nn.Parameter(torch.zeros(10_000))
        p.grad = torch.ones(10_000)
        perturb_grads([p], NOISE_LEVELS["gpu-like"], torch.Generator().manual_seed(seed))
        return p.grad

    a, b, c = perturbed(1), perturbed(1), perturbed(2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert float((a - 1).std()) == pytest.approx(2 ** -8, rel=0.05)


def test_noisy_runs_draw_their_own_seeds_and_more_replicates():
    base = base_recipe("torchtitan")
    tp2 = case_recipe(base, {"id": "x", "moves": {"parallelism.tensor_parallel_degree": 2}})
    quiet = plan_runs(base, tp2, 20, 0, REPLICATES)
    assert all(r.noise == 0 and r.noise_seed == 0 for r in quiet.values())
    noisy = plan_runs(base, tp2, 20, 0, NOISE_REPLICATES, noise=NOISE_LEVELS["gpu-like"])
    seeds = [r.noise_seed for r in noisy.values()]
    assert len(noisy) == 2 * NOISE_REPLICATES + 2 and len(set(seeds)) == len(seeds)   # + the seed checkpoint's run
    assert noisy["candidate"].noise_seed == CANDIDATE_NOISE_SEED
    assert len({r.key() for r in noisy.values()}) == len(noisy)


def test_historical_table_carries_links_and_verdicts():
    bug = historical_bugs()["HF-5605"]
    case = CaseResult(id="H-HF-5605", kind="fault", label="resume", caught=True, false_reject=None, rejected=True,
                      fired=["data", "curve"], checks=[], steps_used=20, mode="paired", seconds=1.0, bug="HF-5605", first_step=11,
                      tracker=bug["tracker"], fix=bug["fix"])
    legit = CaseResult(id="H-L-pp2-1F1B", kind="legit", label="PP 2", caught=None, false_reject=False, rejected=False,
                       fired=[], checks=[], steps_used=20, mode="paired", seconds=1.0)
    report = EvalReport(faults=1, caught=1, caught_runtime=1, caught_config_only=0, legit=1, false_rejects=0,
                        numerics=0, numerics_rejected=0, steps=20, seed=0, seconds=1.0, per_case=[case, legit],
                        trainer="torchtitan", suite="historical")
    text = historical_table(report)
    assert f"[transformers#5605]({bug['tracker']})" in text and "| yes | data, curve | 11 | 20 |" in text and "bugs caught: 1/1" in text
    assert "| passed (legit) |" in text and "legitimate changes passed: 1/1" in text


@needs_torchtitan
@pytest.mark.slow
def test_a_historical_bug_caught_on_real_torchtitan_runs(tmp_path, cli):
    proc = cli("gate", "eval", "--stack", "torchtitan", "--suite", "historical", "--only", "H-HF-5605",
               "--steps", "8", "--workdir", tmp_path, "--json", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    (case,) = report["per_case"]
    assert report["suite"] == "historical" and case["caught"] is True and "data" in case["fired"]
    assert case["tracker"] == historical_bugs()["HF-5605"]["tracker"]
    assert case["first_step"] == 5   # resumed after step 4: the first replayed batch is step 5's


def _curve_folder(folder, candidate_losses, candidate_hashes):
    folder.mkdir()
    for name, losses, hashes in (("baseline-1", [3.0, 2.0, 1.0, 0.5], "abcd"), ("baseline-2", [3.0, 2.0, 1.0, 0.5], "abcd"),
                                 ("candidate", candidate_losses, candidate_hashes)):
        rows = ["step,loss,batch_hash"] + [f"{i + 1},{x},{h}" for i, (x, h) in enumerate(zip(losses, hashes))]
        (folder / f"{name}.csv").write_text("\n".join(rows) + "\n")
    return folder


def test_first_signal_step_reads_the_evidence_of_the_fired_checks(tmp_path):
    from attune.gate.evaluate import first_signal_step
    from attune.gate.models import Check, ConvergenceVerdict

    def verdict(kinds):
        checks = [Check(name=f"{k}.x", kind=k, value=9.0, tolerance=1.0, passed=False) for k in kinds]
        return ConvergenceVerdict(passed=not kinds, verdict="failed" if kinds else "passed", reason="", mode="paired",
                                  steps_used=4, replicates=2, checks=checks, fired=[c.name for c in checks],
                                  band={"loss": {"step": [1, 2, 3, 4], "center": [3.0, 2.0, 1.0, 0.5],
                                                 "halfwidth": [0.01] * 4}})

    folder = _curve_folder(tmp_path / "c", [3.0, 2.0, 1.2, 0.9], "abxy")
    assert first_signal_step(verdict(["curve"]), folder) == 3
    assert first_signal_step(verdict(["data", "curve"]), folder) == 3
    assert first_signal_step(verdict(["data"]), _curve_folder(tmp_path / "d", [3.0, 2.0, 1.0, 0.5], "axcd")) == 2
    assert first_signal_step(verdict(["step1", "curve"]), folder) == 1
    assert first_signal_step(verdict([]), folder) is None


@needs_torchtitan
def test_noise_wraps_a_fault_that_patched_clipping_before_it(monkeypatch):
    """The noise wrapper is installed after the overrides; a fault's own clip must still run under it."""
    import torch
    from torchtitan.distributed import utils as tt_dist_utils
    from attune.stacks.torchtitan import faults
    from attune.stacks.torchtitan.recorder import install_noise
    monkeypatch.setattr(tt_dist_utils, "clip_grad_norm_", tt_dist_utils.clip_grad_norm_)
    faults.clipping_skipped(None)
    install_noise(NOISE_LEVELS["gpu-like"], seed=1)
    p = torch.nn.Parameter(torch.zeros(1000))
    p.grad = torch.full((1000,), 0.5)   # norm ~15.8, never clipped under the fault
    norm = tt_dist_utils.clip_grad_norm_([p], 1.0, foreach=True)
    assert float(norm) == pytest.approx(0.5 * 1000 ** 0.5, rel=1e-3) and float(norm) != 0.5 * 1000 ** 0.5
    assert float(p.grad.norm()) == pytest.approx(float(norm), rel=1e-6)   # noisy, and not clipped


def test_a_crashed_case_is_neither_caught_nor_passed(monkeypatch, tmp_path):
    """A fault whose run crashes leaves no verdict: it must not count as caught (issue 26's note: one
    noisy run was "caught" by a crash of its own run)."""
    from attune.gate import evaluate as ev
    from attune.gate import torchtitan_runs
    monkeypatch.setattr(torchtitan_runs, "converge", lambda *a, **k: (None, "run crashed: exit code 1"))
    case = next(c for c in ev.suite("historical")["cases"] if c["kind"] == "fault")
    result = ev._case(case, base_recipe("historical"), tmp_path, steps=4, replicates=2, workers=1, seed=0,
                      runner=object())
    assert result.rejected and result.crashed and result.caught is False and result.fired == ["run"]
    report = EvalReport(faults=1, caught=0, crashed=1, caught_runtime=0, caught_config_only=0, legit=0,
                        false_rejects=0, numerics=0, numerics_rejected=0, steps=4, seed=0, seconds=1.0,
                        per_case=[result], trainer="torchtitan", gpu_hours=0.0, suite="torchtitan",
                        noise="none", replicates=2)
    assert "1 crashed (not counted)" in ev.table(report) and "**crashed**" in ev.table(report)


def test_one_seed_checkpoint_serves_every_base_of_a_model(tmp_path):
    """The seed run is made once per model: a case whose base changes a training field (HF-23986's
    40-step schedule) loads the checkpoint the suite's base made; its cost is charged once."""
    from attune.gate.torchtitan_runs import SEED, TorchtitanGateRunner
    from attune.stacks.base import TrialStatus
    from attune.stacks.torchtitan.runner import RunOutcome
    from attune.stacks.torchtitan.stack import TorchtitanStack
    made = []

    def executor(launch, log_path, limits, workdir):
        made.append(launch.argv)
        (workdir / "outputs" / "checkpoint" / "step-0").mkdir(parents=True)
        return RunOutcome(status=TrialStatus.CRASH, returncode=0, wall_time_s=36.0, steps=[], message="",
                          log_path=str(log_path))

    runner = TorchtitanGateRunner(TorchtitanStack(executor=executor, validate=False), tmp_path)
    base = base_recipe("historical")
    longer = case_base(base, next(c for c in CASES if c.get("base_set", {}).get("training.steps")))
    for recipe in (base, longer):
        seed = plan_runs(recipe, recipe, 20, 0)[SEED]
        assert runner.run(seed, SEED).ok
    assert len(made) == 1 and runner.gpu_hours == pytest.approx(36.0 / 3600)   # one process, once
    argv = made[0]
    assert "--checkpoint.create_seed_checkpoint" in argv and argv[argv.index("--nproc-per-node") + 1] == "1"
    assert any(a.startswith("attune.stacks.torchtitan.seed_init.seeded_weights=") for a in argv)
