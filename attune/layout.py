"""A recipe's resolved parallel layout, the rules that make it valid, and lever moves with compensation.

Rules (torchtitan's, simplified where noted):
  world size  = dp_replicate · dp_shard · cp · tp · pp        (dp_shard = -1 takes what is left)
  tp divides n_heads and n_kv_heads
  pp · stages_per_rank <= n_layers                            (each stage holds at least one layer)
  local batch divisible by the pipeline micro-batch size     (pipeline micro-batches = local / size)
  pipeline micro-batches as the schedule needs               (1F1B: at least pp; interleaved: whole rounds)
  no lever value the schedule cannot run with                (zero-bubble: no compile, no selective AC)
  cp divides seq_len (cp > 1: in blocks of 128 tokens, torch's CP FlexAttention); ep > 1 only for MoE, divides n_experts and dp_shard · cp · tp
  global batch = local batch · grad-accum · dp, grad-accum a positive integer
  float8 only on accelerators with float8 tensor cores
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from attune.errors import InputError
from attune.levers import Scalar, lever, lever_catalog
from attune.spec import ClusterSpec, ModelSpec

INTERLEAVED_SCHEDULES = {"Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"}

TP, PP, CP, EP = ("parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
                  "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree")
DP_SHARD, DP_REPLICATE = "parallelism.data_parallel_shard_degree", "parallelism.data_parallel_replicate_degree"
PP_SCHEDULE, PP_MICROBATCH = "parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_microbatch_size"
LOCAL_BATCH, GLOBAL_BATCH, SEQ_LEN = "training.local_batch_size", "training.global_batch_size", "training.seq_len"
AC_MODE, COMPILE, FLOAT8 = "activation_checkpoint.mode", "compile.enable", "quantize.float8"

# Levers whose change alters the number of data-parallel ranks: dp_shard must absorb it.
WORLD_SPLITTING = (TP, PP, CP, DP_REPLICATE)


@dataclass(frozen=True)
class MicrobatchRule:
    """What a schedule's constructor demands of n pipeline micro-batches at pp ranks. `ok` takes
    ints or numpy arrays alike, so the vectorised space (attune/sim/space_arrays.py) applies the
    very same rule."""
    ok: Callable[[Any, Any], Any]
    needs: str   # for the message: "{needs}" with n and pp filled in


# The rules levers.toml names per schedule (pipeline_parallel_schedule.microbatches), torch 2.13's.
MICROBATCH_RULES = {
    "at_least_stages": MicrobatchRule(lambda n, pp: n >= pp, "at least pp={pp} pipeline micro-batches"),
    "whole_rounds": MicrobatchRule(lambda n, pp: n % np.maximum(1, n // pp) == 0,
                                   "a number of pipeline micro-batches that splits into whole rounds of "
                                   "pp={pp} (a multiple of max(1, n // pp))"),
}


def microbatch_rule(schedule: str) -> MicrobatchRule | None:
    """The micro-batch rule of a pipeline schedule, None where any count runs."""
    name = lever(PP_SCHEDULE).microbatches.get(schedule)
    return MICROBATCH_RULES[name] if name else None


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    ep: int
    dp_replicate: int
    dp_shard: int
    local_batch: int
    global_batch: int
    seq_len: int
    pp_schedule: str
    pp_microbatch: int
    ac_mode: str
    compile: bool
    float8: str

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def grad_accum(self) -> int:
        return self.global_batch // (self.local_batch * self.dp)

    @property
    def stages_per_rank(self) -> int:
        return 2 if self.pp > 1 and self.pp_schedule in INTERLEAVED_SCHEDULES else 1

    @property
    def n_microbatches(self) -> int:
        """Pipeline micro-batches per local batch (1 without pipelining)."""
        return self.local_batch // self.pp_microbatch if self.pp > 1 else 1

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def levers(self) -> dict[str, Scalar]:
        """Every speed lever with its resolved value (dp_shard explicit)."""
        return {TP: self.tp, PP: self.pp, CP: self.cp, EP: self.ep, DP_REPLICATE: self.dp_replicate,
                DP_SHARD: self.dp_shard, LOCAL_BATCH: self.local_batch, PP_SCHEDULE: self.pp_schedule,
                PP_MICROBATCH: self.pp_microbatch, AC_MODE: self.ac_mode, COMPILE: self.compile,
                FLOAT8: self.float8}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"dp": self.dp, "grad_accum": self.grad_accum}


def _get(config: dict[str, Scalar], key: str) -> Scalar:
    spec = lever(key)
    return spec.coerce(config[key]) if key in config else spec.default


def layout_violations(layout: Layout, model: ModelSpec, cluster: ClusterSpec) -> list[tuple[str, str]]:
    """Every rule the layout breaks, as (field, rule); empty means valid."""
    out: list[tuple[str, str]] = []
    for key, value in ((TP, layout.tp), (PP, layout.pp), (CP, layout.cp), (EP, layout.ep),
                       (DP_REPLICATE, layout.dp_replicate), (LOCAL_BATCH, layout.local_batch),
                       (PP_MICROBATCH, layout.pp_microbatch), (SEQ_LEN, layout.seq_len)):
        if value < 1:
            out.append((key, f"must be >= 1, got {value}"))
    if out:
        return out
    splits = (layout.dp_replicate, layout.cp, layout.tp, layout.pp)
    if layout.dp_shard < 1 or any(cluster.gpus % d for d in splits):
        out.append(_world_split_violation(layout, cluster.gpus))
    elif layout.world != cluster.gpus:
        out.append((DP_SHARD, f"world size dp_replicate·dp_shard·cp·tp·pp = {layout.world} "
                              f"must equal the cluster's {cluster.gpus} GPUs"))
    if model.n_heads % layout.tp or model.n_kv_heads % layout.tp:
        out.append((TP, f"tp={layout.tp} must divide n_heads={model.n_heads} and n_kv_heads={model.n_kv_heads}"))
    if layout.pp * layout.stages_per_rank > model.n_layers:
        out.append((PP, f"pp={layout.pp} with {layout.stages_per_rank} stage(s) per rank needs at least "
                        f"{layout.pp * layout.stages_per_rank} layers, the model has {model.n_layers}"))
    if layout.pp > 1 and layout.local_batch % layout.pp_microbatch:
        out.append((PP_MICROBATCH, f"pipeline micro-batch size {layout.pp_microbatch} must divide "
                                   f"local batch {layout.local_batch}"))
    elif layout.pp > 1 and (rule := microbatch_rule(layout.pp_schedule)) \
            and not rule.ok(layout.n_microbatches, layout.pp):
        out.append((PP_MICROBATCH, f"{layout.pp_schedule} needs {rule.needs.format(pp=layout.pp)}, got local batch "
                                   f"{layout.local_batch} / micro-batch size {layout.pp_microbatch} = "
                                   f"{layout.n_microbatches} (torch's schedule refuses it before step 1)"))
    if layout.pp > 1:
        levers = layout.levers()
        for key, value in lever(PP_SCHEDULE).excludes.get(layout.pp_schedule, {}).items():
            if levers[key] == value:
                out.append((PP_SCHEDULE, f"{layout.pp_schedule} cannot run with {key} = {value} (it splits each "
                                         f"backward in two, which torch refuses there)"))
    if layout.seq_len % layout.cp:
        out.append((CP, f"cp={layout.cp} must divide seq_len={layout.seq_len}"))
    elif layout.cp > 1 and layout.seq_len % (layout.cp * lever(CP).seq_block):
        out.append((CP, f"cp={layout.cp} needs seq_len divisible by cp x {lever(CP).seq_block} "
                        f"(context parallelism splits attention in {lever(CP).seq_block}-token blocks), "
                        f"got seq_len={layout.seq_len}"))
    if layout.ep > 1:
        if not model.is_moe:
            out.append((EP, "expert parallelism needs an MoE model"))
        elif model.n_experts % layout.ep:
            out.append((EP, f"ep={layout.ep} must divide n_experts={model.n_experts}"))
        elif layout.dp_shard >= 1 and (layout.dp_shard * layout.cp * layout.tp) % layout.ep:
            out.append((EP, f"ep={layout.ep} must divide dp_shard·cp·tp = "
                            f"{layout.dp_shard * layout.cp * layout.tp}"))
    if layout.dp_shard >= 1 and layout.world == cluster.gpus:
        per_step = layout.local_batch * layout.dp
        if layout.global_batch < per_step or layout.global_batch % per_step:
            out.append((LOCAL_BATCH, f"global batch {layout.global_batch} must be a multiple of "
                                     f"local batch × dp = {layout.local_batch}×{layout.dp}"))
    if layout.float8 != "none" and not cluster.part.supports_float8:
        out.append((FLOAT8, f"{cluster.accelerator} has no float8 tensor cores"))
    return out


def _world_split_violation(layout: Layout, gpus: int) -> tuple[str, str]:
    """dp_shard = -1 has nothing left to take: blame the degree the user set, not dp_shard (which
    was derived). A degree that alone does not divide the GPUs is named; when each divides but
    their product does not, the largest of them is."""
    degrees = {TP: ("tp", layout.tp), PP: ("pp", layout.pp), CP: ("cp", layout.cp),
               DP_REPLICATE: ("dp_replicate", layout.dp_replicate)}
    others = layout.dp_replicate * layout.cp * layout.tp * layout.pp
    for key, (short, value) in degrees.items():
        if gpus % value:
            return key, f"{short}={value} must divide the cluster's {gpus} GPUs"
    key = max(degrees, key=lambda k: degrees[k][1])
    return key, (f"dp_replicate·cp·tp·pp = {others} must divide the cluster's {gpus} GPUs "
                 f"(lower {degrees[key][0]}={degrees[key][1]})")


def resolve_layout(config: dict[str, Scalar], model: ModelSpec, cluster: ClusterSpec,
                   check: bool = True) -> Layout:
    """The layout a config describes on this cluster; raises InputError for the first broken rule."""
    tp, pp, cp = _get(config, TP), _get(config, PP), _get(config, CP)
    dp_replicate, dp_shard = _get(config, DP_REPLICATE), _get(config, DP_SHARD)
    if dp_shard == -1:
        rest = cluster.gpus // max(1, dp_replicate * cp * tp * pp)
        dp_shard = rest if rest * dp_replicate * cp * tp * pp == cluster.gpus else 0
    local_batch = _get(config, LOCAL_BATCH)
    global_batch = _get(config, GLOBAL_BATCH)
    if global_batch == -1:
        global_batch = local_batch * dp_replicate * dp_shard
    layout = Layout(tp=tp, pp=pp, cp=cp, ep=_get(config, EP), dp_replicate=dp_replicate, dp_shard=dp_shard,
                    local_batch=local_batch, global_batch=global_batch, seq_len=_get(config, SEQ_LEN),
                    pp_schedule=_get(config, PP_SCHEDULE), pp_microbatch=_get(config, PP_MICROBATCH),
                    ac_mode=_get(config, AC_MODE), compile=_get(config, COMPILE), float8=_get(config, FLOAT8))
    if check:
        problems = layout_violations(layout, model, cluster)
        if problems:
            raise InputError(*problems[0])
    return layout


def apply_levers(config: dict[str, Scalar], moves: dict[str, Scalar], model: ModelSpec,
                 cluster: ClusterSpec) -> dict[str, Scalar]:
    """The config with `moves` applied plus the compensations they force, or InputError if invalid.

    Compensations keep the objective fixed: the global batch is pinned to the baseline's effective
    value (so a smaller local batch raises gradient accumulation), and an explicit dp_shard is
    recomputed so the world size holds when tp, pp, cp or dp_replicate change.
    """
    catalog = lever_catalog()
    for key, value in moves.items():
        if key not in catalog or not (catalog[key].speed_only or catalog[key].numerics):
            raise InputError(key, "not a speed lever; only speed levers may be moved")
        catalog[key].coerce(value)
    before = resolve_layout(config, model, cluster)
    new = dict(config) | dict(moves)
    new[GLOBAL_BATCH] = before.global_batch
    explicit_shard = config.get(DP_SHARD, -1) != -1
    if explicit_shard and DP_SHARD not in moves and any(k in moves for k in WORLD_SPLITTING):
        new[DP_SHARD] = -1  # let it absorb the change, then write it back explicitly as the recipe had it
        new[DP_SHARD] = resolve_layout(new, model, cluster, check=False).dp_shard
    resolve_layout(new, model, cluster)
    return new


def with_layout(layout: Layout, **changes: Any) -> Layout:
    return replace(layout, **changes)


def adapt_to_cluster(config: dict[str, Scalar], model: ModelSpec,
                     cluster: ClusterSpec) -> tuple[dict[str, Scalar], dict[str, tuple[Scalar, Scalar]]]:
    """Fit a recipe's explicit degrees to another cluster: dp_shard re-derived, then the largest
    degree that no longer fits halved until the layout is valid. Objective fields are untouched.

    Returns the new config and what changed ({field: (old, new)}); InputError if nothing fits.
    """
    new = dict(config)
    if new.get(DP_SHARD, -1) != -1:
        new[DP_SHARD] = -1
    for _ in range(32):
        layout = resolve_layout(new, model, cluster, check=False)
        problems = layout_violations(layout, model, cluster)
        if not problems:
            break
        degrees = {TP: layout.tp, PP: layout.pp, CP: layout.cp, DP_REPLICATE: layout.dp_replicate, EP: layout.ep}
        field = problems[0][0]
        if field not in degrees or degrees[field] == 1:
            field = max(degrees, key=lambda k: degrees[k])
        if degrees[field] == 1:
            raise InputError(*problems[0])
        new[field] = max(1, degrees[field] // 2)
    else:
        raise InputError(*problems[0])
    changes = {k: (config.get(k, lever(k).default), v) for k, v in new.items()
               if k in lever_catalog() and v != config.get(k, lever(k).default)}
    return new, changes
