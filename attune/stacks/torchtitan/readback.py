"""The layout a torchtitan run ran, read back after the run, and its comparison with the one asked for.

A trial records the layout ATTUNE asked for; what trained is what torchtitan resolved. The two can
differ without an error anywhere: a lever the recipe leaves to a default that torchtitan's recipe
sets otherwise (a PP = 2 trial of llama3_debugmodel recorded 1F1B while torchtitan ran its recipe's
Interleaved1F1B), an override that rewrites a field, a torchtitan release that resolves a field
anew. A record of a layout that did not run corrupts everything downstream (the trial history, the
fitted model, the shipped recipe, the leaderboard), so after every run that got as far as building
its model the layout is read back and compared field by field; a difference is an error that names
both values (`mismatches`), never a record.

Read from two places, both written by torchtitan itself:
  its resolved config (`--debug.save_config_file config.json`, rank 0, into the run's dump folder):
      the schedule, the pipeline micro-batch size, the local batch, compile.enable
  its log (rank 0's lines, which every launch keeps): what it derived
      "Building device mesh with parallelism: pp=2, dp_replicate=1, dp_shard=1, cp=1, tp=1, ep=1"
      "Trainer is initialized with local batch size 2, global batch size 8, gradient accumulation
       steps 4, sequence length 128, ..."
      "Using pipeline schedule Interleaved1F1B with 2 microbatches and 4 stages."
      "Applied FullAC activation checkpointing to the model"        (no such line: no recomputation)
Not read back: float8. torchtitan 0.3 builds it into the model definition (a derived Linear config),
and neither the saved config nor the log names it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from attune.layout import (AC_MODE, COMPILE, CP, DP_REPLICATE, DP_SHARD, EP, GLOBAL_BATCH, LOCAL_BATCH, PP,
                           PP_MICROBATCH, PP_SCHEDULE, SEQ_LEN, TP, Layout)
from attune.stacks.torchtitan.log_parser import strip_ansi

CONFIG_FILE = "config.json"          # debug.save_config_file, relative to the run's dump_folder
MICROBATCHES = "pipeline micro-batches"
ACCUMULATION = "gradient accumulation steps"
# Fields torchtitan's saved config holds as ATTUNE names them (a lever key is torchtitan's dotted field).
CONFIG_FIELDS = (PP_SCHEDULE, PP_MICROBATCH, LOCAL_BATCH, COMPILE)
MESH = re.compile(r"Building device mesh with parallelism: pp=(?P<pp>\d+), dp_replicate=(?P<dpr>\d+), "
                  r"dp_shard=(?P<dps>\d+), cp=(?P<cp>\d+), tp=(?P<tp>\d+), ep=(?P<ep>\d+)")
TRAINER = re.compile(r"Trainer is initialized with local batch size (?P<local>\d+), global batch size (?P<glob>\d+), "
                     r"gradient accumulation steps (?P<accum>\d+), sequence length (?P<seq>\d+)")
PIPELINE = re.compile(r"Using pipeline schedule (?P<schedule>\S+) with (?P<n>\d+) microbatches")
AC_APPLIED = re.compile(r"Applied (?P<policy>\w+) activation checkpointing to the model")
AC_POLICIES = {"FullAC": "full", "SelectiveAC": "selective", "MemoryBudgetAC": "memory-budget"}


def _dotted(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def ran(config_path: Path | str | None, log_path: Path | str | None) -> dict[str, Any]:
    """What the run's own records say it ran, by field; a field neither record gives is absent.
    An empty dict: the run never got as far as resolving its layout (nothing to compare)."""
    config: dict[str, Any] = {}
    if config_path is not None and Path(config_path).is_file():
        try:
            config = json.loads(Path(config_path).read_text())
        except (OSError, ValueError):
            config = {}
    log = ""
    if log_path is not None and Path(log_path).is_file():
        log = strip_ansi(Path(log_path).read_text(errors="replace"))
    out: dict[str, Any] = {}
    for key in CONFIG_FIELDS:
        value = _dotted(config, key)
        if value is not None:
            out[key] = value
    if mesh := MESH.search(log):
        out |= {PP: int(mesh["pp"]), DP_REPLICATE: int(mesh["dpr"]), DP_SHARD: int(mesh["dps"]), CP: int(mesh["cp"]),
                TP: int(mesh["tp"]), EP: int(mesh["ep"])}
    if trainer := TRAINER.search(log):
        out |= {LOCAL_BATCH: int(trainer["local"]), GLOBAL_BATCH: int(trainer["glob"]),
                ACCUMULATION: int(trainer["accum"]), SEQ_LEN: int(trainer["seq"])}
        # the model is built before the trainer says it is initialized: no policy line means none
        policy = AC_APPLIED.search(log)
        out[AC_MODE] = AC_POLICIES.get(policy["policy"], policy["policy"]) if policy else "none"
    if pipe := PIPELINE.search(log):
        out |= {PP_SCHEDULE: pipe["schedule"], MICROBATCHES: int(pipe["n"])}
    return out


def requested(layout: Layout) -> dict[str, Any]:
    """The fields a run of this layout must show (float8 aside: not read back, see above)."""
    want: dict[str, Any] = {TP: layout.tp, PP: layout.pp, CP: layout.cp, EP: layout.ep,
                            DP_REPLICATE: layout.dp_replicate, DP_SHARD: layout.dp_shard,
                            LOCAL_BATCH: layout.local_batch, GLOBAL_BATCH: layout.global_batch,
                            ACCUMULATION: layout.grad_accum, SEQ_LEN: layout.seq_len,
                            AC_MODE: layout.ac_mode, COMPILE: layout.compile}
    if layout.pp > 1:   # pipeline-only fields mean nothing without a pipeline
        want |= {PP_SCHEDULE: layout.pp_schedule, PP_MICROBATCH: layout.pp_microbatch,
                 MICROBATCHES: layout.n_microbatches}
    return want


def mismatches(layout: Layout, seen: dict[str, Any], complete: bool = True) -> list[str]:
    """Each field whose run differs from the request, as "FIELD ran X, requested Y", and (complete:
    a run that trained, so its records must give every field) each they do not give ("FIELD not read
    back"); empty: the run ran the layout asked for, as far as it got."""
    out = []
    for key, want in requested(layout).items():
        if key not in seen:
            if complete:
                out.append(f"{key} not read back (torchtitan's saved config and log do not give it)")
        elif seen[key] != want:
            out.append(f"{key} ran {seen[key]!r}, requested {want!r}")
    return out


def check(layout: Layout, config_path: Path | str | None, log_path: Path | str | None,
          complete: bool = True) -> str | None:
    """None when the run ran `layout`; else the error, naming what ran and what was asked for. A run
    that ended early (complete=False: out of memory, a crash) is held to what it got as far as
    resolving; one that resolved nothing is left to its own status."""
    seen = ran(config_path, log_path)
    if not seen and not complete:
        return None
    if not seen:
        return ("the run's layout could not be read back: neither torchtitan's saved config "
                f"({config_path}) nor its log ({log_path}) gives it")
    wrong = mismatches(layout, seen, complete)
    if not wrong:
        return None
    return "the run's layout is not the one requested: " + "; ".join(wrong)
