"""Public measurements (attune/data/calibration/*.csv) as step-model inputs, and the check table.

Two CSV shapes are read:
  * torchtitan-shaped (header has dp_shard, activation_checkpoint, compile, float8, async_tp):
    stack "torchtitan"; hbm_gib and power_w describe the part (torchtitan's benchmark H100s are
    96 GB parts at a 500 W limit). pp_microbatch_size is optional (default: micro-batch 1).
  * Megatron-shaped (header has micro_batch_size, vp, precision): stack "megatron", NVIDIA DGX
    parts at their TDP. Megatron's micro-batches map to pipeline micro-batches (pp > 1) or to
    gradient-accumulation steps (pp = 1); vp is the interleaving depth; fp8 / mxfp8 run the
    linears in float8; Transformer Engine's fusions count as compiled; no recomputation unless named.

This module never imports the ground truth: `calibration_table(predict)` takes the predictor
(tests pass the ground truth, noise off), so the planners' side of the package stays clean.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attune.data_files import DATA_DIR
from attune.sim.arrays import AC_MODES, SCHEDULES, LayoutArrays, from_columns
from attune.sim.hardware import Hardware, hardware
from attune.sim.params import MemoryParams, memory_params
from attune.spec import ClusterSpec, ModelSpec, StackSpec, catalog_model

CALIBRATION_DIR = DATA_DIR / "calibration"
# The stack each calibration point ran on, for seeding the ground truth's hidden effects.
CALIBRATION_STACKS = {"torchtitan": StackSpec(torch="2.6.0", torchtitan="0.1.0"),
                      "megatron": StackSpec(torch="2.7.0", torchtitan="megatron-core")}


@dataclass(frozen=True)
class Point:
    source: str
    model: ModelSpec
    cluster: ClusterSpec
    hw: Hardware
    stack: str
    layout: LayoutArrays      # one entry
    measured_tps: float
    measured_memory_gib: float | None
    label: str
    fsdp: bool = False        # a Megatron row run with Megatron-FSDP instead of the distributed optimizer
    pipeline_slots: int | None = None   # non-decoder slots of the row's custom pipeline layout

    @property
    def stack_spec(self) -> StackSpec:
        return CALIBRATION_STACKS[self.stack]

    def memory_params(self) -> MemoryParams:
        """The stack's memory parameters, with FSDP's sharding where the row ran FSDP and the row's own
        pipeline split where it gave one (pipeline_layout)."""
        mem = memory_params(self.stack)
        if self.fsdp:
            mem = mem.model_copy(update={"distributed_optimizer": False})
        if self.pipeline_slots is not None:
            mem = mem.model_copy(update={"embedding_in_pipeline_split": True, "pipeline_slots": self.pipeline_slots})
        return mem


def _num(text: str, default: float | None = None) -> float | None:
    text = (text or "").strip()
    return float(text) if text and text.lower() != "n/a" else default


def _torchtitan_point(row: dict[str, str]) -> Point:
    model = catalog_model(row["model"])
    gpus = int(row["gpus"])
    cluster = ClusterSpec(accelerator=row["accelerator"], gpus=gpus, hbm_gib=_num(row.get("hbm_gib")))
    hw = hardware(cluster, power_w=_num(row.get("power_w")), hbm_gib=_num(row.get("hbm_gib")))
    tp, pp, cp, dps = (int(row[k]) for k in ("tp", "pp", "cp", "dp_shard"))
    sched = (row.get("pp_schedule") or "1F1B").strip() or "1F1B"
    f8 = row["float8"].strip()
    f8_code = 0 if f8 in ("", "none") else (2 if f8 == "rowwise" else 1)   # "rowwise-or-tensorwise": tensorwise
    comp = row["compile"].strip().lower() == "true"
    la = from_columns(tp=tp, pp=pp, cp=cp, ep=1, dpr=gpus // (dps * tp * pp * cp), dps=dps,
                      lb=int(row["local_batch_size"]), gbs=int(row["global_batch_size"]), seq=int(row["seq_len"]),
                      sched=SCHEDULES.index(sched), mb=int(_num(row.get("pp_microbatch_size"), 1)),
                      ac=AC_MODES.index(row["activation_checkpoint"].strip() or "selective"), comp=comp,
                      f8=f8_code, async_tp=comp and row.get("async_tp", "").strip().lower() == "true")
    label = (f"fsdp{dps} tp{tp} pp{pp} cp{cp} {sched if pp > 1 else ''} lb{row['local_batch_size']} "
             f"s{row['seq_len']} ac={row['activation_checkpoint']} compile={int(comp)} f8={f8 or 'none'}"
             f"{' asyncTP' if la.async_tp[0] else ''}")
    return Point(source=row["source"], model=model, cluster=cluster, hw=hw, stack="torchtitan", layout=la,
                 measured_tps=float(row["tokens_per_sec_per_gpu"]), measured_memory_gib=_num(row.get("memory_gib")),
                 label=" ".join(label.split()))


def _megatron_point(row: dict[str, str]) -> Point:
    model = catalog_model(row["model"])
    gpus = int(row["gpus"])
    cluster = ClusterSpec(accelerator=row["accelerator"], gpus=gpus)
    hw = hardware(cluster)
    tp, pp, cp = (int(_num(row[k], 1)) for k in ("tp", "pp", "cp"))
    ep = int(_num(row.get("ep"), 1))
    vp = int(_num(row.get("vp"), 1))
    mbs = int(_num(row.get("micro_batch_size"), 1))
    dp = gpus // (tp * pp * cp)
    # NeMo 24.07's llama3.1-70b row names no batch sizes: NeMo's 70B recipe used GBS 128, MBS 1.
    gbs = int(_num(row.get("global_batch_size"), 128))
    lb = gbs // dp if pp > 1 else mbs               # PP: all micro-batches in one pipeline run
    prec = row["precision"].lower()
    f8 = 0 if prec.startswith("bf16") else 1
    sched = "Interleaved1F1B" if pp > 1 and vp > 1 else "1F1B"
    recompute = (row.get("recompute") or "").strip().lower()
    ac = "full" if recompute == "full" else ("selective" if recompute else "none")
    la = from_columns(tp=tp, pp=pp, cp=cp, ep=ep, dpr=1, dps=dp, lb=lb, gbs=gbs, seq=int(row["seq_len"]),
                      sched=SCHEDULES.index(sched), mb=mbs, ac=AC_MODES.index(ac), comp=True, f8=f8,
                      v=vp if pp > 1 else 1)
    label = f"tp{tp} pp{pp} vp{vp} cp{cp} ep{ep} dp{dp} mbs{mbs} gbs{gbs} s{row['seq_len']} {prec}"
    fsdp = "fsdp" in (row.get("dp_note") or "").lower()
    slots = pipeline_layout_slots(row.get("pipeline_layout") or "", model.n_layers, pp * vp)
    return Point(source=row["source"], model=model, cluster=cluster, hw=hw, stack="megatron", layout=la,
                 measured_tps=float(row["tokens_per_sec_per_gpu"]), measured_memory_gib=None,
                 label=label + (" fsdp" if fsdp else ""), fsdp=fsdp, pipeline_slots=slots)


def pipeline_layout_slots(layout: str, n_layers: int, chunks: int) -> int | None:
    """The non-decoder slots of a Megatron `pipeline_model_parallel_layout` ("Et|(tt|)*30mL": E the
    embedding, t a decoder layer, m an MTP block, L the loss, | between virtual stages), checked
    against the model and the pipeline; None for no layout."""
    if not layout:
        return None
    expanded = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout)
    stages = expanded.split("|")
    if expanded.count("t") != n_layers or len(stages) != chunks or set(expanded) - set("Etm|L"):
        raise ValueError(f"pipeline_layout {layout!r} does not place {n_layers} layers on {chunks} stages")
    # the split is even when every stage holds the same number of slots
    if len({len(stage) for stage in stages}) != 1:
        raise ValueError(f"pipeline_layout {layout!r}: stages of unequal slot counts are not modelled")
    return len(expanded.replace("|", "")) - n_layers


def load_points(paths: list[Path] | None = None) -> list[Point]:
    """Every row of the given CSVs (default: all of attune/data/calibration/*.csv)."""
    points = []
    for path in paths or sorted(CALIBRATION_DIR.glob("*.csv")):
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            megatron = "vp" in (reader.fieldnames or [])
            for row in reader:
                points.append(_megatron_point(row) if megatron else _torchtitan_point(row))
    return points


Predict = Callable[[Point], dict[str, np.ndarray]]


def estimate_point(point: Point) -> dict[str, np.ndarray]:
    """A calibration point on the public model (no hidden effects): what a planner would predict."""
    from attune.sim.stepmodel import evaluate
    return evaluate(point.model, point.hw, point.layout, point.stack, mem=point.memory_params())


def calibration_table(predict: Predict, points: list[Point] | None = None) -> list[dict]:
    """One dict per point: source, model, accelerator, gpus, layout, measured, predicted, error."""
    rows = []
    for p in points if points is not None else load_points():
        cols = predict(p)
        tps, mem = float(cols["tps"][0]), float(cols["mem_total_gib"][0])
        rows.append({"source": p.source, "model": p.model.name, "cluster": f"{p.cluster.accelerator}:{p.cluster.gpus}",
                     "stack": p.stack, "layout": p.label, "measured": p.measured_tps, "predicted": tps,
                     "error": tps / p.measured_tps - 1.0, "measured_memory_gib": p.measured_memory_gib,
                     "predicted_memory_gib": mem, "fits": bool(cols["fits"][0])})
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'source':58} {'model':16} {'cluster':9} {'layout':66} {'measured':>9} {'predicted':>9} {'error':>7}  mem meas/pred"
    lines = [head, "-" * len(head)]
    for r in rows:
        mem = (f"{r['measured_memory_gib']:.1f}/{r['predicted_memory_gib']:.1f}" if r["measured_memory_gib"]
               else f"-/{r['predicted_memory_gib']:.1f}")
        lines.append(f"{r['source'][:58]:58} {r['model']:16} {r['cluster']:9} {r['layout'][:66]:66} "
                     f"{r['measured']:9.1f} {r['predicted']:9.1f} {r['error']:+7.1%}  {mem}")
    errs = np.abs([r["error"] for r in rows])
    lines.append(f"{len(rows)} points: median |error| {np.median(errs):.1%}, max {errs.max():.1%}")
    return "\n".join(lines)
