"""Config check: every objective field fails when changed, every lever's compensation passes, defects."""

from __future__ import annotations

import pytest

from attune.layout import GLOBAL_BATCH, apply_levers
from attune.levers import lever_catalog, speed_levers
from attune.recipe import load_recipe
from attune.gate import check_config, defects
from attune.gate.fields import _table, classify, objective_fields

MOE_RECIPE = """
name = "moe"
model = "qwen3-30b-a3b"
[cluster]
accelerator = "h100"
gpus = 8
[stack]
torch = "2.13.0"
torchtitan = "0.3.0"
[config]
"training.local_batch_size" = 2
"training.seq_len" = 8192
"optimizer.lr" = 3e-4
"""


@pytest.fixture
def base(write_recipe):
    return load_recipe(write_recipe(MOE_RECIPE, "base.toml"))


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7
    if isinstance(value, float):
        return value * 2 + 0.5
    return f"{value}-other"


@pytest.mark.parametrize("field", objective_fields())
def test_each_objective_field_fails_when_changed(base, field):
    rule = classify(field)
    new = _changed(rule.default) if rule.has_default else "set-only-in-candidate"
    verdict = check_config(base, base.with_config(dict(base.config) | {field: new}))
    assert not verdict.passed
    assert field in [v.field for v in verdict.violations]


@pytest.mark.parametrize("field", objective_fields())
def test_objective_field_written_at_its_default_is_equal_in_effect(base, field):
    rule = classify(field)
    if not rule.has_default or field in base.config:
        pytest.skip("no known default, or the base recipe sets it")
    assert check_config(base, base.with_config(dict(base.config) | {field: rule.default})).passed


def test_issue_objective_list_is_classified():
    for field in ("training.global_batch_size", "training.seq_len", "optimizer.name", "optimizer.lr",
                  "optimizer.beta1", "optimizer.beta2", "optimizer.eps", "optimizer.weight_decay",
                  "lr_scheduler.warmup_steps", "lr_scheduler.decay_type", "training.max_norm", "loss.name",
                  "loss.normalization", "training.dataset", "debug.seed", "training.steps", "training.dtype",
                  "training.mixed_precision_param", "training.mixed_precision_reduce", "moe.capacity_factor",
                  "moe.token_dropping", "moe.router_dtype", "moe.load_balance_coeff", "moe.aux_loss_coeff"):
        assert classify(field).cls == "objective", field
    assert classify("quantize.float8").cls == "numerics"


def test_unknown_field_is_objective_until_classified(base):
    assert classify("training.loss_scale").source == "unknown"
    verdict = check_config(base, base.with_config(dict(base.config) | {"training.loss_scale": 2.0}))
    assert [v.field for v in verdict.violations] == ["training.loss_scale"]
    assert "until classified" in verdict.violations[0].reason
    same = base.with_config(dict(base.config) | {"training.loss_scale": 2.0})
    assert check_config(same, same).passed


def test_seq_len_and_tokens_per_step(base):
    verdict = check_config(base, base.with_config(dict(base.config) | {"training.seq_len": 4096}))
    fields = [v.field for v in verdict.violations]
    assert "training.seq_len" in fields and "tokens_per_step" in fields


def test_global_batch_compared_in_effect(base):
    explicit = base.with_config(dict(base.config) | {GLOBAL_BATCH: 16})   # = local 2 x dp 8
    assert check_config(base, explicit).passed
    other = base.with_config(dict(base.config) | {GLOBAL_BATCH: 32})
    assert [v.field for v in check_config(base, other).violations][:1] == [GLOBAL_BATCH]
    halved = base.with_config(dict(base.config) | {"training.local_batch_size": 1})  # no compensation
    fields = [v.field for v in check_config(base, halved).violations]
    assert GLOBAL_BATCH in fields and "tokens_per_step" in fields


MOVES = {"parallelism.tensor_parallel_degree": 2, "parallelism.pipeline_parallel_degree": 2,
         "parallelism.pipeline_parallel_schedule": "GPipe", "parallelism.pipeline_parallel_microbatch_size": 2,
         "parallelism.context_parallel_degree": 2, "parallelism.expert_parallel_degree": 2,
         "parallelism.data_parallel_shard_degree": -1, "parallelism.data_parallel_replicate_degree": 2,
         "training.local_batch_size": 1, "activation_checkpoint.mode": "full", "compile.enable": True,
         "quantize.float8": "rowwise"}


def test_every_speed_lever_has_a_move_here():
    assert set(speed_levers()) == set(MOVES)


@pytest.mark.parametrize("lever", sorted(MOVES))
def test_each_lever_move_with_its_compensation_passes(base, lever):
    config = apply_levers(base.config, {lever: MOVES[lever]}, base.architecture, base.cluster)
    candidate = base.with_config(config)
    assert GLOBAL_BATCH not in base.config and config[GLOBAL_BATCH] == 16  # written explicitly, equal in effect
    verdict = check_config(base, candidate)
    assert not verdict.violations, verdict.violations
    if lever == "compile.enable":  # MoE + compile + (default selective) recomputation on torch 2.13: known defect
        assert [d.id for d in verdict.defects] == ["PT-186572"]
    else:
        assert verdict.passed, verdict.defects
    assert verdict.tokens_per_step["baseline"] == verdict.tokens_per_step["candidate"]
    if lever_catalog()[lever].numerics:
        assert [n.field for n in verdict.numerics_change] == [lever]
        assert "numerics change" in verdict.numerics_change[0].reason
    else:
        assert not verdict.numerics_change


def test_compensated_dp_change_keeps_tokens_but_uncompensated_fails(base):
    moved = apply_levers(base.config, {"parallelism.tensor_parallel_degree": 2}, base.architecture, base.cluster)
    assert check_config(base, base.with_config(moved)).passed
    raw = base.with_config(dict(base.config) | {"parallelism.tensor_parallel_degree": 2})  # global -1 -> halves
    assert GLOBAL_BATCH in [v.field for v in check_config(base, raw).violations]


def test_stack_change_is_a_numerics_change(base):
    other = base.model_copy(update={"stack": base.stack.model_copy(update={"torch": "2.12.0"})})
    verdict = check_config(base, other)
    assert verdict.passed and [n.field for n in verdict.numerics_change] == ["stack.torch"]


def test_unparsable_version_fails(base):
    other = base.model_copy(update={"stack": base.stack.model_copy(update={"torchtitan": "main"})})
    assert "stack.torchtitan" in [v.field for v in check_config(base, other).violations]


# ---- defects catalog ------------------------------------------------------------------------

def test_catalog_has_sourced_entries_across_trackers():
    entries = defects.catalog()
    assert len(entries) >= 15
    trackers = {"pytorch/torchtitan", "pytorch/pytorch", "NVIDIA/Megatron-LM", "NVIDIA/TransformerEngine",
                "deepspeedai/DeepSpeed"}
    assert trackers <= {"/".join(d.source.split("/")[3:5]) for d in entries}
    for d in entries:
        assert d.source.startswith("https://github.com/") and d.range_note and d.symptom
        assert d.component in d.versions
        for condition in d.when:
            defects._parse(condition)


def test_float8_with_tp_matches_the_torchtitan_defect(base):
    moved = apply_levers(base.config, {"quantize.float8": "rowwise", "parallelism.tensor_parallel_degree": 2},
                         base.architecture, base.cluster)
    verdict = check_config(base, base.with_config(moved))
    assert not verdict.passed
    hit = verdict.defects[0]
    assert hit.id == "TT-3109" and hit.source.endswith("/issues/3109")


def test_defect_version_range_is_respected(base):
    # GPipe: one micro-batch per flush is a schedule torch builds (1F1B needs pp of them)
    pp_ga = apply_levers(base.config, {"parallelism.pipeline_parallel_degree": 2, "training.local_batch_size": 1,
                                       "parallelism.pipeline_parallel_schedule": "GPipe"},
                         base.architecture, base.cluster)
    pp_ga[GLOBAL_BATCH] = 16  # pp 2 halves DP: accumulation 2 with micro-batch 1 -> 16 = 1 x 4 x ... keep 16
    candidate = base.with_config(pp_ga)
    old = candidate.model_copy(update={"stack": candidate.stack.model_copy(update={"torchtitan": "0.1.0"})})
    assert "TT-1733" in [d.id for d in defects.match(old)]
    assert "TT-1733" not in [d.id for d in defects.match(candidate)]


def test_non_torchtitan_entries_match_only_their_own_packages(base, monkeypatch):
    ds = base.with_config(dict(base.config) | {"deepspeed.zero_stage": 2, "deepspeed.bf16": True})
    assert "DS-8224" not in [d.id for d in defects.match(ds)]  # the stack carries no deepspeed
    monkeypatch.setattr(defects, "stack_versions", lambda r: {"torch": "2.13.0", "deepspeed": "0.19.3"})
    assert "DS-8224" in [d.id for d in defects.match(ds)]
    monkeypatch.setattr(defects, "stack_versions", lambda r: {"torch": "2.13.0", "deepspeed": "0.18.2"})
    assert "DS-8224" not in [d.id for d in defects.match(ds)]


def test_field_table_classes_are_valid():
    table = _table()
    assert {v["class"] for v in table["fields"].values()} <= {"objective", "numerics", "speed"}
    assert {p["class"] for p in table["patterns"]} <= {"objective", "numerics", "speed"}
