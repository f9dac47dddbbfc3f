"""`attune gate`: the correctness gate from the command line.

  attune gate [check] --baseline A.toml --candidate B.toml [--curves DIR | --proxy | --stack torchtitan] [--json]
  attune gate eval [--stack sim|torchtitan] [--suite default|historical] [--noise none|gpu-like] [--steps N] [--quick] [--json]

--stack says whose training runs the convergence check reads: sim (default) trains the CPU proxy,
torchtitan runs the recipes' own trainer (real torchtitan runs; on a CPU-only machine, on CPU
processes) and charges them as GPU-hours.

One parser with an optional action, so the bare form (`attune gate --baseline ...`) and the
sub-action form (`attune gate eval ...`) both parse as written. Exit codes: 0 the gate passed,
1 it failed, 2 bad input (one line on stderr), 3 inconclusive (not passed: the verdict says how many
steps would decide it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attune.cli.common import emit
from attune.errors import InputError
from attune.files import atomic_write_text
from attune.recipe import load_recipe

_CHECK_ONLY = ("baseline", "candidate", "curves", "proxy", "pairing", "workdir")
EXIT = {"passed": 0, "failed": 1, "inconclusive": 3}

CURVES_HELP = """\
curves folder (--curves DIR): baseline-1.csv .. baseline-k.csv (k >= 2 replicates of the baseline,
same seed; put at least two on the candidate's data order) and candidate.csv, one row per logged step.
  header   step,loss[,optional columns in any order]
  eval_loss        loss on a fixed held-out batch
  grad_norm        pre-clip global gradient norm (its first common step is compared)
  lr               the learning rate the step applied (must equal the replicates')
  tokens           tokens the step's loss covered, after masking or dropping
  batch_id         an id of the step's batch (index, sample offset, hash): exact pairing
  batch_hash       the same, as a hash (the gate's own runs write it)
  expert_imbalance MoE: coefficient of variation of tokens per expert
A column counts only when every file has it. Runs of unequal length or with missing steps are
compared on the steps all of them logged. Without batch ids, the replicates that saw the
candidate's batches are found from the curves (their step-to-step loss movements correlate):
--pairing off judges the candidate against all replicates instead.
verdict: passed | failed | inconclusive (exit 0 | 1 | 3); inconclusive says how many steps decide it."""
_EVAL_ONLY = ("quick", "only", "workers", "suite", "noise")
SUITES = ("default", "historical")
NOISE = ("none", "gpu-like")


def register(subparsers: argparse._SubParsersAction) -> None:
    gate = subparsers.add_parser(
        "gate", help="correctness gate: config check, known defects, convergence (or `gate eval`: its fault suite)",
        description="attune gate [check] --baseline RECIPE --candidate RECIPE [--curves DIR | --proxy | "
                    "--stack torchtitan] [--json]\nattune gate eval [--stack STACK] [--suite SUITE] [--noise MODE] "
                    "[--steps N] [--quick] [--json]",
        epilog=CURVES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    gate.add_argument("action", nargs="?", choices=("check", "eval"), default="check", metavar="ACTION",
                      help="check (default): judge a candidate; eval: run the fault and legitimate suites")
    gate.add_argument("--baseline", metavar="RECIPE", help="the baseline recipe (check)")
    gate.add_argument("--candidate", metavar="RECIPE", help="the candidate recipe (check)")
    gate.add_argument("--curves", metavar="DIR",
                      help="curves folder: baseline-1.csv ... and candidate.csv, header step,loss[,...] (check; "
                           "columns below)")
    gate.add_argument("--pairing", choices=("auto", "off"), metavar="MODE",
                      help="--curves without batch ids: auto (default) pairs the candidate with the replicates "
                           "whose loss movements show its batches; off compares it with all of them (check)")
    gate.add_argument("--proxy", action="store_true",
                      help="train real curves on the CPU proxy and run the convergence check on them (check)")
    gate.add_argument("--stack", choices=("sim", "torchtitan"), default="sim", metavar="STACK",
                      help="whose runs the convergence check reads: sim = the CPU proxy (default), "
                           "torchtitan = real torchtitan runs of the recipes")
    gate.add_argument("--workdir", "--out", dest="workdir", metavar="DIR",
                      help="where the verdict goes: gate_report.json and the plot gate.png (check), and the curves "
                           "--proxy / --stack torchtitan / eval train (default: ./gate-run; eval: a temporary "
                           "folder); never the --curves folder, which is only read")
    gate.add_argument("--steps", type=int, metavar="N",
                      help="steps per run (proxy: 40, eval --quick 12; torchtitan: 20, eval --quick 8)")
    gate.add_argument("--quick", action="store_true", help="eval: a small subset at few steps (for tests)")
    gate.add_argument("--only", metavar="IDS", help="eval: comma-separated case ids")
    gate.add_argument("--suite", metavar="SUITE",
                      help="eval --stack torchtitan: default (injected faults, legitimate changes) or historical "
                           "(silent-correctness bugs that happened, gate/historical_bugs.toml)")
    gate.add_argument("--noise", metavar="MODE",
                      help="eval --stack torchtitan: none (default; the CPU runs are bitwise deterministic) or "
                           "gpu-like (seeded run-to-run gradient noise, the band calibrated on 4 replicates)")
    gate.add_argument("--workers", type=int, metavar="N", help="eval: proxy runs in parallel processes (default 1)")
    gate.add_argument("--seed", type=int, metavar="N", help="proxy seed (initial weights; default 0)")
    gate.add_argument("--json", action="store_true", help="print JSON")
    gate.set_defaults(func=_run)


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    return [f"--{n}" for n in names if getattr(args, n) not in (None, False)]


def _run(args: argparse.Namespace) -> int:
    if args.steps is not None and args.steps < 1:
        raise InputError("--steps", f"must be a positive integer, got {args.steps}")
    if args.action == "eval":
        wrong = _given(args, _CHECK_ONLY[:-1])
        if wrong:
            raise InputError(wrong[0], "not an option of `attune gate eval`")
        return _eval(args)
    wrong = _given(args, _EVAL_ONLY)
    if wrong:
        raise InputError(wrong[0], "only `attune gate eval` takes this option")
    return _check(args)


def _check(args: argparse.Namespace) -> int:
    from attune.gate.config_check import check_config
    from attune.gate.convergence import check_convergence
    from attune.gate.models import GateReport

    for flag in ("baseline", "candidate"):
        if not getattr(args, flag):
            raise InputError(f"--{flag}", "required (attune gate --baseline A.toml --candidate B.toml)")
    if args.curves and args.proxy:
        raise InputError("--curves", "give either --curves DIR or --proxy, not both")
    if args.pairing and not args.curves:
        raise InputError("--pairing", "only with --curves DIR (the gate's own runs record batch hashes)")
    if args.stack == "torchtitan" and (args.curves or args.proxy):
        raise InputError("--stack", "torchtitan makes its own curves: drop --curves / --proxy")
    baseline, candidate = load_recipe(args.baseline), load_recipe(args.candidate)
    if args.stack == "torchtitan":
        from attune.gate.torchtitan_runs import verify as verify_torchtitan

        report = verify_torchtitan(baseline, candidate, Path(args.workdir or "gate-run"), steps=args.steps,
                                   seed=args.seed or 0, say=_say(args))
    elif args.proxy:
        from attune.gate.pipeline import verify

        report = verify(baseline, candidate, Path(args.workdir or "gate-run"), steps=args.steps, seed=args.seed or 0)
    else:
        config = check_config(baseline, candidate)
        if args.curves:   # the plot goes beside the report, not into the user's curves folder
            verdict = check_convergence(Path(args.curves), _out(args), infer_pairing=args.pairing != "off")
            outcome = verdict.verdict if config.passed else "failed"
            note = verdict.reason if config.passed else "config check failed; convergence: " + verdict.reason
            report = GateReport(passed=outcome == "passed", verdict=outcome, config=config, convergence=verdict,
                                note=note, steps_used=verdict.steps_used, plot=verdict.plot)
        else:
            numerics = bool(config.numerics_change)
            note = "config check only: no curves given, convergence not checked"
            if numerics:
                note += "; a numerics change needs the convergence check (--curves DIR or --proxy)"
            report = GateReport(passed=config.passed and not numerics, config=config, convergence=None, note=note)
    if args.curves or args.proxy or args.stack == "torchtitan":
        atomic_write_text(_out(args) / "gate_report.json", json.dumps(report.model_dump(mode="json"), indent=1))
    emit(report.model_dump(mode="json"), args.json, _text(report))
    return EXIT[report.verdict]


def _out(args: argparse.Namespace) -> Path:
    out = Path(args.workdir or "gate-run")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _say(_args: argparse.Namespace):
    """Progress lines on stderr (torchtitan runs take seconds each; a suite takes minutes)."""
    return lambda line: print(f"[attune] {line}", file=sys.stderr, flush=True)


def _text(report) -> str:
    state = {"passed": "PASS", "failed": "FAIL", "inconclusive": "INCONCLUSIVE"}[report.verdict]
    lines = [f"gate: {state} ({report.note})"]
    for v in report.config.violations:
        lines.append(f"  objective field {v.field}: {v.reason} (baseline {v.baseline!r}, candidate {v.candidate!r})")
    for d in report.config.defects:
        lines.append(f"  known defect {d.id}: {d.symptom} [{d.source}]")
    for n in report.config.numerics_change:
        lines.append(f"  numerics change {n.field}: {n.reason}")
    if report.convergence is not None:
        c = report.convergence
        paired = f"paired with {', '.join(c.paired_with)} ({c.pairing.replace('_', ' ')})" if c.paired_with \
            else "unpaired"
        lines.append(f"  convergence: {c.verdict}; {paired}, {c.steps_used} steps, {c.replicates} replicates; "
                     f"worst {c.statistic.get('name')} (ratio {c.statistic.get('ratio')}); plot {c.plot}")
        if c.verdict == "inconclusive" and c.need_more_steps:
            lines.append(f"  inconclusive: about {c.need_more_steps} steps would decide it")
    return "\n".join(lines)


def _suite_name(args: argparse.Namespace) -> str:
    """Which suite file `eval` runs: proxy, torchtitan or historical (bad input: InputError)."""
    for flag, value, allowed in (("--suite", args.suite, SUITES), ("--noise", args.noise, NOISE)):
        if value is not None and value not in allowed:
            raise InputError(flag, f"must be one of {', '.join(allowed)}, got {value!r}")
        if value is not None and args.stack != "torchtitan":
            raise InputError(flag, "only with --stack torchtitan")
    if args.suite == "historical":
        return "historical"
    return "torchtitan" if args.stack == "torchtitan" else "proxy"


def _eval(args: argparse.Namespace) -> int:
    from attune.gate.evaluate import evaluate, suite, table

    name = _suite_name(args)
    only = [s.strip() for s in args.only.split(",")] if args.only else None
    if only:
        known = {c["id"] for c in suite(name)["cases"]}
        unknown = [s for s in only if s not in known]
        if unknown:
            raise InputError("--only", f"unknown case id {unknown[0]!r}")
    workers = 1 if args.workers is None else args.workers
    if workers < 1:
        raise InputError("--workers", f"must be >= 1, got {workers}")
    report = evaluate(steps=args.steps, quick=args.quick, workdir=Path(args.workdir) if args.workdir else None,
                      workers=workers, only=only, seed=args.seed or 0, say=_say(args), suite_name=name,
                      noise=args.noise or "none")
    if args.json:
        json.dump(report.model_dump(mode="json"), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(table(report) + "\n")
    return 0 if report.false_rejects == 0 and report.caught == report.faults else 1
