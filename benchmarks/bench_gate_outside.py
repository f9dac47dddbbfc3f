"""The correctness gate on curves from an outside trainer: with and without pairing.

    .venv/bin/python benchmarks/bench_gate_outside.py [--regime rounding|gpu-like|all] [--json]

The trainer is benchmarks/outside_trainer.py (numpy, neither the proxy nor torchtitan). Per
regime: four baseline replicates (two on the candidate's data order, two on other orders) and one
candidate per case (5 legitimate changes, 15 faults), 300 steps each, exported as CSVs the way a
user brings them to `attune gate --curves DIR`, and judged by the gate in six ways:

  before     step,loss only; no pairing, z fully correlated (the gate as of 2026-12-04)
  unpaired   step,loss only; pairing off (today's statistics)
  paired-fc  step,loss only; pairing inferred, but z treated as fully correlated (pairing alone)
  paired     step,loss only; pairing inferred from the curves (gate/pairing.py)
  columns    + grad_norm, lr, tokens columns; pairing inferred
  batch_id   + a batch_id column: exact pairing

`effect` is how far the candidate moves the paired loss, in units of the same-data pair's sd
(outside_trainer.paired_effect). Target (issue 26): every fault past 3 of those sds caught,
0 legitimate changes rejected. About 15 s per regime on one core.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"   # one core: set before numpy is imported

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.outside_trainer import MODES, REGIMES, evaluate, summary  # noqa: E402

SHORT = {"passed": "pass", "failed": "FAIL", "inconclusive": "inc."}


def table(regime: str, results: dict) -> str:
    modes = list(MODES)
    lines = [f"### regime {regime} (nondeterminism {REGIMES[regime]})", "",
             "| case | kind | effect (pair sds) | " + " | ".join(modes) + " |",
             "| --- | --- | ---: | " + " | ".join("---" for _ in modes) + " |"]
    for cid, r in results.items():
        cells = []
        for m in modes:
            cell = SHORT[r[m]]
            if r[f"{m}/fired"] and r[m] == "failed":
                cell += " (" + ", ".join(r[f"{m}/fired"]) + ")"
            cells.append(cell)
        lines.append(f"| {cid} | {r['kind']} | {r['effect']:+.1f} | " + " | ".join(cells) + " |")
    lines += ["", "| mode | faults caught | legit rejected | inconclusive | faults > 3 pair sds caught | target |",
              "| --- | --- | --- | --- | --- | --- |"]
    for m in modes:
        s = summary(results, m)
        lines.append(f"| {m} | {s['caught']}/{s['faults']} | {s['false_rejects']}/{s['legit']} | {s['inconclusive']} | "
                     f"{s['big_caught']}/{s['big_faults']} | {'holds' if s['target'] else 'no'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", choices=[*REGIMES, "all"], default="all")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    regimes = list(REGIMES) if args.regime == "all" else [args.regime]
    out = {}
    with tempfile.TemporaryDirectory(prefix="attune-gate-outside-") as tmp:
        for regime in regimes:
            start = time.perf_counter()
            out[regime] = evaluate(Path(tmp), regime)
            seconds = time.perf_counter() - start
            if not args.json:
                print(table(regime, out[regime]))
                print(f"\n({seconds:.0f} s)\n")
    if args.json:
        json.dump({reg: {"cases": res, "summary": {m: summary(res, m) for m in MODES}} for reg, res in out.items()},
                  sys.stdout, indent=1)
        print()
    return 0 if all(summary(res, "paired")["target"] for res in out.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
