"""Two `attune gate eval --json` reports of one suite side by side (docs/gate.md's tables), and the
spread of the baseline replicates' loss that the noisy report's band was calibrated on.

    .venv/bin/attune gate eval --stack torchtitan --suite historical --workdir W1 --json > det.json
    .venv/bin/attune gate eval --stack torchtitan --suite historical --noise gpu-like --workdir W2 --json > noisy.json
    .venv/bin/python scripts/gate_side_by_side.py det.json noisy.json [--workdir W2]

--workdir (the noisy run's): the loss spread across the base's replicates at steps 1, 10 and the
last one, from the curves the verdicts read.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path


def verdict(case: dict) -> str:
    if case["kind"] == "legit":
        return "**false reject**" if case["false_reject"] else "passed"
    word = "caught" if case["caught"] else "**missed**"
    return f"{word} (control)" if case["kind"] == "control" else word


def cell(case: dict | None) -> str:
    if case is None:
        return "- | - | -"
    return f"{verdict(case)} | {', '.join(case['fired']) or '-'} | {case.get('first_step') or '-'}/{case['steps_used'] or '-'}"


def table(left: dict, right: dict, names: tuple[str, str]) -> str:
    a, b = ({c["id"]: c for c in r["per_case"]} for r in (left, right))
    head = (f"| case | kind | {names[0]}: verdict | checks | first/steps | {names[1]}: verdict | checks | "
            "first/steps |")
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for cid in list(a) + [c for c in b if c not in a]:
        case = a.get(cid) or b[cid]
        lines.append(f"| {case.get('bug') or cid} | {case['kind']} | {cell(a.get(cid))} | {cell(b.get(cid))} |")
    for name, r in zip(names, (left, right)):
        lines.append(f"\n{name}: faults caught {r['caught']}/{r['faults']}, legitimate rejected "
                     f"{r['false_rejects']}/{r['legit']}; {r.get('replicates')} replicates, {r['steps']} steps, "
                     f"{r['seconds']:.0f} s, {r['gpu_hours']} process-hours")
    return "\n".join(lines)


def replicate_spread(workdir: Path) -> str:
    """Loss sd across the base replicates of the first case that has >= 3 same-order replicates."""
    for folder in sorted(workdir.glob("*/curves")):
        reps = []
        for path in sorted(folder.glob("baseline-*.csv")):
            with path.open(newline="") as f:
                reps.append({int(r["step"]): (float(r["loss"]), r.get("batch_hash")) for r in csv.DictReader(f)})
        same = [r for r in reps if [h for _, h in r.values()] == [h for _, h in reps[0].values()]]
        if len(same) >= 3:
            last = max(same[0])
            parts = []
            for step in (1, last // 2, last):
                losses = [r[step][0] for r in same]
                parts.append(f"step {step}: mean {statistics.mean(losses):.5f}, sd {statistics.stdev(losses):.2e}")
            return f"{folder.parent.name}, {len(same)} same-order replicates: " + "; ".join(parts)
    return "no case with 3 or more same-order replicates"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("left")
    parser.add_argument("right")
    parser.add_argument("--names", default="deterministic,gpu-like")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    left, right = (json.loads(Path(p).read_text()) for p in (args.left, args.right))
    print(table(left, right, tuple(args.names.split(","))))
    if args.workdir:
        print("\nreplicate loss spread: " + replicate_spread(args.workdir))


if __name__ == "__main__":
    main()
