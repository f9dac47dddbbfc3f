"""Reading and writing a curves folder.

Layout of a folder (one verdict):
  baseline-1.csv, baseline-2.csv, ...   the replicates (k >= 2), same seed and data policy
  candidate.csv                         the run under test
  <name>.step1.json                     optional: that run's step-1 probe record (see proxy.train.probe)
  manifest.json                         optional: {"tier": "exact" | "numerics", "numerics_change": [...]}
Each CSV starts with the header `step,loss`; optional further columns, in any order:
  eval_loss   loss on a fixed held-out batch (plain next-token cross-entropy)
  grad_norm   pre-clip global gradient norm
  lr          the learning rate the step applied
  tokens      tokens the step's loss was computed over (after masking or dropping)
  expert_imbalance  MoE: coefficient of variation of tokens per expert over the step's batch
  batch_hash  order-independent hash of the step's global batch (data identity; pairs runs that saw
              the same batches)
  batch_id    any identifier of the step's batch instead (an index, a sample offset): the same use
A file with only `step,loss` is valid on its own; a column is used only when every run has it.
Runs of unequal length, or with steps missing (logged every N steps, a gap), are compared on the
steps every run logged (CurveSet.alignment says how many of each run's were used).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from attune.errors import InputError
from attune.files import atomic_write_text

OPTIONAL = ("eval_loss", "grad_norm", "lr", "tokens", "expert_imbalance", "batch_hash", "batch_id")
_IDS = ("batch_hash", "batch_id")
MIN_COMMON_STEPS = 3   # fewer steps logged by every run: nothing to compare
# Curve metrics the convergence check compares. grad_norm is read and kept as evidence but not
# compared over the curve: its trajectory spikes at clipping events whose timing is chaotic, the
# most heavy-tailed metric measured on the proxy (step 1 compares gradient norms exactly).
METRICS = ("loss", "eval_loss", "expert_imbalance")
_BASELINE = re.compile(r"^baseline-(\d+)\.csv$")


@dataclass
class Curve:
    name: str
    steps: list[int]
    columns: dict[str, list[float]] = field(default_factory=dict)   # loss, eval_loss, grad_norm
    hashes: list[str] | None = None
    step1: dict | None = None


@dataclass
class CurveSet:
    baselines: list[Curve]
    candidate: Curve
    manifest: dict
    alignment: dict = field(default_factory=dict)   # common steps used, and each run's logged steps

    @property
    def metrics(self) -> list[str]:
        runs = self.baselines + [self.candidate]
        return [m for m in METRICS if all(m in r.columns for r in runs)]

    @property
    def has_hashes(self) -> bool:
        return all(r.hashes is not None for r in self.baselines + [self.candidate])


def _read_csv(path: Path) -> Curve:
    if not path.is_file():
        raise InputError(str(path), "curve file not found")
    rows = list(csv.reader(io.StringIO(path.read_text())))
    if not rows or [h.strip() for h in rows[0][:2]] != ["step", "loss"]:
        raise InputError(str(path), "a curve file must start with the header `step,loss`")
    header = [h.strip() for h in rows[0]]
    unknown = [h for h in header[2:] if h not in OPTIONAL]
    if unknown:
        raise InputError(str(path), f"unknown column(s) {', '.join(unknown)}; allowed after step,loss: "
                                    f"{', '.join(OPTIONAL)}")
    if len(set(header)) != len(header):
        raise InputError(str(path), "a column is named twice")
    if all(h in header for h in _IDS):
        raise InputError(str(path), "give batch_hash or batch_id, not both")
    body = [r for r in rows[1:] if any(cell.strip() for cell in r)]
    if not body:
        raise InputError(str(path), "no data rows")
    has_id = any(h in header for h in _IDS)
    curve = Curve(name=path.stem, steps=[], columns={h: [] for h in header[1:] if h not in _IDS},
                  hashes=[] if has_id else None)
    for n, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise InputError(f"{path}:{n}", f"expected {len(header)} values, got {len(row)}")
        try:
            step = int(row[0])
        except ValueError:
            raise InputError(f"{path}:{n}", f"step must be an integer, got {row[0]!r}") from None
        if curve.steps and step <= curve.steps[-1]:
            raise InputError(f"{path}:{n}", "steps must increase")
        curve.steps.append(step)
        for h, cell in zip(header[1:], row[1:]):
            if h in _IDS:
                curve.hashes.append(cell.strip())
                continue
            try:
                value = float(cell)
            except ValueError:
                raise InputError(f"{path}:{n}", f"{h} must be a number, got {cell!r}") from None
            if not math.isfinite(value) or (h == "grad_norm" and value <= 0) or \
                    (h in ("expert_imbalance", "lr", "tokens") and value < 0):
                raise InputError(f"{path}:{n}", f"{h} is {cell}: the run diverged or logged garbage")
            curve.columns[h].append(value)
    return curve


def _restrict(curve: Curve, keep: list[int]) -> None:
    """Keep the rows of these steps only (sorted, all present in the curve)."""
    index = {s: i for i, s in enumerate(curve.steps)}
    rows = [index[s] for s in keep]
    curve.columns = {h: [v[i] for i in rows] for h, v in curve.columns.items()}
    if curve.hashes is not None:
        curve.hashes = [curve.hashes[i] for i in rows]
    curve.steps = list(keep)


def align(runs: list[Curve], folder: Path) -> dict:
    """Restrict every run to the steps all of them logged; what was used, and what each run had."""
    common = set(runs[0].steps)
    for curve in runs[1:]:
        common &= set(curve.steps)
    if len(common) < MIN_COMMON_STEPS:
        short = min(runs, key=lambda c: len(c.steps))
        raise InputError(str(folder / f"{short.name}.csv"),
                         f"the runs share only {len(common)} logged step(s) (curves of different length or "
                         f"steps: {short.name} logs {len(short.steps)}, {short.steps[0]}..{short.steps[-1]}); "
                         f"need {MIN_COMMON_STEPS}")
    keep = sorted(common)
    info = {"steps": len(keep), "first": keep[0], "last": keep[-1],
            "logged": {c.name: len(c.steps) for c in runs},
            "dropped": {c.name: len(c.steps) - len(keep) for c in runs if len(c.steps) != len(keep)}}
    for curve in runs:
        if len(curve.steps) != len(keep):
            _restrict(curve, keep)
    return info


def _read_step1(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InputError(str(path), f"not valid JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise InputError(str(path), "a step-1 record must be a JSON object")
    return data


def read_curves(folder: Path | str) -> CurveSet:
    """Every run of a curves folder, validated: >= 2 baselines, a candidate, identical step columns."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(str(folder), "curves folder not found")
    numbered = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _BASELINE.match(p.name)))
    if len(numbered) < 2:
        raise InputError(str(folder), "need at least two baseline replicates (baseline-1.csv, baseline-2.csv, ...)")
    expected = list(range(1, len(numbered) + 1))
    if [i for i, _ in numbered] != expected:
        missing = sorted(set(range(1, max(i for i, _ in numbered) + 1)) - {i for i, _ in numbered})
        raise InputError(str(folder / f"baseline-{missing[0]}.csv"), "curve file not found (replicates are numbered 1..k)")
    runs = []
    for _, path in numbered + [(0, folder / "candidate.csv")]:
        curve = _read_csv(path)
        curve.step1 = _read_step1(path.with_suffix(".step1.json"))
        runs.append(curve)
    alignment = align(runs, folder)
    manifest_path = folder / "manifest.json"
    manifest = _read_step1(manifest_path) or {}
    if manifest.get("tier", "exact") not in ("exact", "numerics"):
        raise InputError(str(manifest_path), "tier must be exact or numerics")
    return CurveSet(baselines=runs[:-1], candidate=runs[-1], manifest=manifest, alignment=alignment)


def write_curve(path: Path, rows: list[dict], step1: dict | None = None) -> None:
    """One run as CSV (+ its step-1 JSON), each file written whole or not at all."""
    columns = ["step", "loss"] + [c for c in OPTIONAL if rows and rows[0].get(c) is not None]
    if "batch_hash" in columns and "batch_id" in columns:
        columns.remove("batch_id")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([row[c] if c in ("step", *_IDS) else repr(float(row[c])) for c in columns])
    atomic_write_text(path, buf.getvalue())
    if step1 is not None:
        atomic_write_text(path.with_suffix(".step1.json"), json.dumps(step1, indent=1, sort_keys=True))


def write_manifest(folder: Path, manifest: dict) -> None:
    atomic_write_text(folder / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True))


def write_folder(folder: Path, runs: dict[str, tuple[list[dict], dict | None]], manifest: dict,
                 runs_info: dict[str, dict]) -> Path:
    """A whole curves folder (name -> (rows, step-1 record)), built beside its final place and
    renamed: never half-written. runs_info goes to runs.json (what each run was, how long it took)."""
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, (rows, step1) in runs.items():
        write_curve(tmp / f"{name}.csv", rows, step1)
    write_manifest(tmp, manifest)
    (tmp / "runs.json").write_text(json.dumps(runs_info, indent=1, default=str))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.replace(folder)
    return folder
