"""The convergence check on the recipe's own trainer: real torchtitan 0.3 runs of the baseline and
the candidate, their curves and step-1 records, and the check of gate/convergence.py on them.

A gate run is a short torchtitan run of the recipe with ATTUNE's recorder override
(attune/stacks/torchtitan/recorder.py): every run starts from the same weights, loaded from one seed
checkpoint made once per verdict (attune/stacks/torchtitan/seed_init.py: a one-process run of the
baseline's model, its cost charged like any gate run, its file reused by every replicate and the
candidate, whatever their layout: pipeline stages included), and composes each
step's global batch as torchtitan's own loader would at the run's data-parallel degree, so two
layouts with the same DP degree see the same batches and are compared pairwise, and a layout that
changes the DP degree (and with it torchtitan's data order) is compared with baseline runs made
under its data order. It records loss and gradient norm at full precision, the post-clip norm,
the update norm, the LR and the batch hash every step, and step-1 group norms and gradient
sketches (gate-study.md: what the loss cannot show).

Runs go through the stack's executor, like trials, and are charged: each run holds the recipe's
GPUs for its wall time (`gpu_hours` of the report). On this CPU-only machine the torchtitan stack
trains on CPU processes (attune/stacks/torchtitan/cpu.py), where runs are bitwise deterministic:
replicates agree exactly, and the metric precision floors of gate/stats.py set the band. With
`noise` (NOISE_LEVELS, `attune gate eval --noise gpu-like`) every run perturbs its gradients by a
seeded relative noise before clipping (recorder.py says why that resembles a GPU's run-to-run
variation): each replicate and the candidate draw their own noise, NOISE_REPLICATES replicates
calibrate the band, and the band is then the runs' own spread instead of the precision floor.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from attune.layout import CP, DP_REPLICATE, DP_SHARD, EP, PP, TP
from attune.recipe import Recipe
from attune.stacks.torchtitan.recipe_values import OVERRIDE_IMPORTS, recipe_values
from attune.stacks.torchtitan.runner import RunLimits
from attune.stacks.torchtitan.stack import TorchtitanStack
from attune.gate.config_check import check_config
from attune.gate.convergence import check_convergence
from attune.gate.curves import write_folder
from attune.gate.models import ConfigVerdict, ConvergenceVerdict, GateReport

DEFAULT_STEPS = 20
MAX_DOUBLINGS = 1
REPLICATES = 2          # identical on a deterministic CPU, so two suffice there; real GPUs differ
ORDER_REPLICATES = 2
RECORDER = "attune.stacks.torchtitan.recorder.gate_run"
SEED_INIT = "attune.stacks.torchtitan.seed_init.seeded_weights"
INIT_SEED = 0           # the seeded draw of the seed checkpoint's weights (seed_init.py)
SEED = "seed"           # the plan's name for the run that makes the seed checkpoint
FAULTS_MODULE = "attune.stacks.torchtitan.faults"
OVERRIDES_PACKAGE = "attune.stacks.torchtitan"   # a fault named module.factory lives in this package
# Relative gradient noise per element. gpu-like: one bfloat16 unit in the last place (2^-8), the
# size of the rounding difference a reordered bf16 reduction makes (recorder.py).
NOISE_LEVELS = {"none": 0.0, "gpu-like": 2.0 ** -8}
NOISE_REPLICATES = 4    # noisy replicates differ: the band needs more than two to be estimated
CANDIDATE_NOISE_SEED = 1000
SETTINGS_ENV = "ATTUNE_GATE_RUN"
STEP1_KEYS = ("grad_norm", "post_clip_norm", "update_norm", "lr", "valid_tokens", "max_norm",
              "group_grad_norms", "group_update_norms", "grad_sketch")


@dataclass(frozen=True)
class GateRun:
    """One torchtitan run of a gate verdict."""
    recipe: Recipe
    order_dp: int
    steps: int
    seed: int
    faults: tuple[str, ...] = ()
    noise: float = 0.0        # relative gradient noise (NOISE_LEVELS); 0 = deterministic
    noise_seed: int = 0
    makes_seed: bool = False  # the run that makes the seed checkpoint (trains nothing)

    def key(self) -> str:
        noise = [self.noise, self.noise_seed] if self.noise else []
        return hashlib.sha256(json.dumps([self.recipe.config, self.recipe.cluster.model_dump(),
                                          self.recipe.torchtitan.model_dump() if self.recipe.torchtitan else None,
                                          self.order_dp, self.steps, self.seed, self.faults, *noise,
                                          *(["seed"] if self.makes_seed else [])],
                                         sort_keys=True, default=str).encode()).hexdigest()[:20]


@dataclass
class RunRecord:
    ok: bool
    rows: list[dict] = field(default_factory=list)
    step1: dict | None = None
    gpu_hours: float = 0.0
    seconds: float = 0.0
    message: str = ""
    log: str = ""


def data_order(recipe: Recipe) -> int:
    """torchtitan shards its data by data-parallel rank: the DP degree is the run's data order."""
    return recipe.layout().dp


def seed_recipe(recipe: Recipe) -> Recipe:
    """The recipe of the run that makes the seed checkpoint: the same model on one process, no
    parallelism (torchtitan makes a seed checkpoint only at a world size of 1)."""
    config = dict(recipe.config) | {TP: 1, PP: 1, CP: 1, EP: 1, DP_REPLICATE: 1, DP_SHARD: -1}
    cluster = recipe.cluster.model_copy(update={"gpus": 1, "gpus_per_node": 1})
    return recipe.model_copy(update={"config": config, "cluster": cluster, "name": f"{recipe.name}-seed"})


def plan_runs(baseline: Recipe, candidate: Recipe, steps: int, seed: int, replicates: int = REPLICATES,
              faults: tuple[str, ...] = (), noise: float = 0.0) -> dict[str, GateRun]:
    """The seed checkpoint's run first, then baseline-1..k (the baseline's data order, then
    ORDER_REPLICATES under the candidate's when it differs) and the candidate. With noise every run
    draws its own noise seed (the candidate one no replicate has), and the order replicates are as
    many as the others. The seed run is planned, charged and reserved like the others."""
    base_order, cand_order = data_order(baseline), data_order(candidate)
    runs = [GateRun(baseline, base_order, steps, seed + i, noise=noise, noise_seed=1 + i if noise else 0)
            for i in range(replicates)]
    if cand_order != base_order:
        order_replicates = max(ORDER_REPLICATES, replicates) if noise else ORDER_REPLICATES
        runs += [GateRun(baseline, cand_order, steps, seed + 100 + i, noise=noise,
                         noise_seed=101 + i if noise else 0) for i in range(order_replicates)]
    plan = {SEED: GateRun(seed_recipe(baseline), 1, 0, INIT_SEED, makes_seed=True)}
    plan |= {f"baseline-{i}": run for i, run in enumerate(runs, start=1)}
    plan["candidate"] = GateRun(candidate, cand_order, steps, seed, faults, noise=noise,
                                noise_seed=CANDIDATE_NOISE_SEED if noise else 0)
    return plan


def override_import(name: str) -> str:
    """A case's fault: a factory of faults.py (`lr_doubled`) or module.factory of the package."""
    return f"{OVERRIDES_PACKAGE}.{name}" if "." in name else f"{FAULTS_MODULE}.{name}"


def records_to_curve(records: list[dict]) -> tuple[list[dict], dict | None]:
    """Recorder lines -> (curve rows: step, loss, grad_norm, batch_hash; the step-1 record)."""
    rows = [{"step": r["step"], "loss": r["loss"], "grad_norm": r["grad_norm"], "batch_hash": r.get("batch_hash")}
            for r in records]
    if rows and any(row["batch_hash"] is None for row in rows):
        rows = [{k: v for k, v in row.items() if k != "batch_hash"} for row in rows]
    first = next((r for r in records if r["step"] == 1), None)
    step1 = None if first is None else {"forward_loss": first["loss"]} | {k: first[k] for k in STEP1_KEYS if k in first}
    return rows, step1


def _recipe_imports(recipe: Recipe) -> list[str]:
    """The recipe's own --override.imports (a gate run adds to them, never replaces them)."""
    own = recipe_values(recipe.torchtitan.module, recipe.torchtitan.config) or {} if recipe.torchtitan else {}
    text = recipe.config.get(OVERRIDE_IMPORTS, own.get(OVERRIDE_IMPORTS, ""))
    return [entry for entry in str(text).split(",") if entry]


def seed_key(recipe: Recipe) -> str:
    """What a seed checkpoint's weights depend on: the model (torchtitan's module and config, the
    recipe's own overrides) and the draw, not the layout."""
    return hashlib.sha256(json.dumps([recipe.torchtitan.model_dump() if recipe.torchtitan else None,
                                      _recipe_imports(recipe), INIT_SEED]).encode()).hexdigest()[:20]


class TorchtitanGateRunner:
    """Runs gate runs through a torchtitan stack, each once per process (baseline replicates and the
    seed checkpoint are shared by every candidate of a suite or a campaign), and adds up what they
    were charged."""

    def __init__(self, stack: TorchtitanStack, workdir: Path, say: Callable[[str], None] | None = None):
        self.stack, self.workdir, self.say = stack, Path(workdir).resolve(), say
        self.done: dict[str, RunRecord] = {}
        self.seeds: dict[str, Path] = {}     # seed_key -> the checkpoint every run of that model loads
        self.gpu_hours = 0.0

    def run(self, run: GateRun, name: str = "") -> RunRecord:
        key = run.key()
        if run.makes_seed:   # one per model, whatever else the bases of a suite's cases change
            key = f"seed-{seed_key(run.recipe)}"
        if key in self.done:
            return self.done[key]
        if run.makes_seed:
            return self._make_seed(run, key)
        checkpoint = self.seeds.get(seed_key(run.recipe))
        if checkpoint is None:   # a run planned without its seed (plan_runs puts the seed first)
            made = self.run(GateRun(seed_recipe(run.recipe), 1, 0, INIT_SEED, makes_seed=True), SEED)
            if not made.ok:
                return made
            checkpoint = self.seeds[seed_key(run.recipe)]
        workdir = self.workdir / "runs" / key
        workdir.mkdir(parents=True, exist_ok=True)
        record_path = workdir / "record.jsonl"
        layout = run.recipe.layout()
        settings = {"record": str(record_path), "order_dp": run.order_dp, "global_batch": layout.global_batch,
                    "max_norm": run.recipe.config.get("training.max_norm"), "pp": layout.pp,
                    "steps": run.steps, "accumulation": layout.grad_accum, "dp": layout.dp}
        if run.noise:
            settings["noise"] = {"scale": run.noise, "seed": run.noise_seed}
        (workdir / "settings.json").write_text(json.dumps(settings))
        imports = _recipe_imports(run.recipe) + [override_import(name) for name in run.faults] + [RECORDER]
        stack = copy.copy(self.stack)
        stack.warmup_steps = 0
        stack.extra_config = dict(self.stack.extra_config) | {
            OVERRIDE_IMPORTS: ",".join(imports), "checkpoint.enable": True, "checkpoint.load_only": True,
            "checkpoint.initial_load_path": str(checkpoint)}
        launch = stack.launch(run.recipe, run.steps, run.seed, workdir)
        launch = launch.model_copy(update={"env": launch.env | {SETTINGS_ENV: str(workdir / "settings.json")}})
        (workdir / "launch.json").write_text(json.dumps(launch.payload(), indent=2))
        if self.say:
            self.say(f"gate run {name + ': ' if name else ''}{run.recipe.name} (data order dp={run.order_dp}"
                     f"{', faults ' + ','.join(run.faults) if run.faults else ''}"
                     f"{f', noise {run.noise:.3g} seed {run.noise_seed}' if run.noise else ''}): {run.steps} steps")
        started = time.perf_counter()
        limits = RunLimits(measure_steps=None, warmup_steps=0, startup_timeout_s=stack.startup_timeout_s,
                           stall_timeout_s=stack.stall_timeout_s)
        # a run that trained another layout than its recipe's is no evidence about that recipe
        outcome = stack.checked(run.recipe, stack.executor(launch, workdir / "train.log", limits, workdir), workdir)
        records = [json.loads(line) for line in record_path.read_text().splitlines() if line.strip()] \
            if record_path.is_file() else []
        gpu_hours = run.recipe.cluster.gpus * outcome.wall_time_s / 3600.0
        self.gpu_hours += gpu_hours
        ok = outcome.status.value == "ok" and len(records) >= run.steps
        rows, step1 = records_to_curve(records)
        result = RunRecord(ok=ok, rows=rows, step1=step1, gpu_hours=gpu_hours, seconds=time.perf_counter() - started,
                           message=outcome.message if not ok else "", log=outcome.log_path)
        self.done[key] = result
        return result

    def _make_seed(self, run: GateRun, key: str) -> RunRecord:
        """torchtitan's seed checkpoint of the run's model (one process, the gate's seeded draw)."""
        workdir = self.workdir / "seeds" / seed_key(run.recipe)
        workdir.mkdir(parents=True, exist_ok=True)
        imports = _recipe_imports(run.recipe) + [f"{SEED_INIT}={json.dumps({'init_seed': run.seed})}"]
        stack = copy.copy(self.stack)
        stack.warmup_steps = 0
        stack.extra_config = dict(self.stack.extra_config) | {
            OVERRIDE_IMPORTS: ",".join(imports), "checkpoint.enable": True, "checkpoint.create_seed_checkpoint": True}
        launch = stack.launch(run.recipe, 1, run.seed, workdir)
        (workdir / "launch.json").write_text(json.dumps(launch.payload(), indent=2))
        if self.say:
            self.say(f"gate run {SEED}: the seed checkpoint of {run.recipe.name} (one process)")
        started = time.perf_counter()
        limits = RunLimits(measure_steps=None, warmup_steps=0, startup_timeout_s=stack.startup_timeout_s,
                           stall_timeout_s=stack.stall_timeout_s)
        outcome = stack.executor(launch, workdir / "train.log", limits, workdir)
        gpu_hours = run.recipe.cluster.gpus * outcome.wall_time_s / 3600.0
        self.gpu_hours += gpu_hours
        checkpoint = stack.ran_config(workdir).parent / "checkpoint" / "step-0"
        ok = outcome.returncode == 0 and checkpoint.is_dir()
        if ok:
            self.seeds[seed_key(run.recipe)] = checkpoint
        result = RunRecord(ok=ok, gpu_hours=gpu_hours, seconds=time.perf_counter() - started, log=outcome.log_path,
                           message="" if ok else f"no seed checkpoint ({outcome.message})")
        self.done[key] = result
        return result


def converge(baseline: Recipe, candidate: Recipe, config: ConfigVerdict, workdir: Path, steps: int, seed: int,
             runner: TorchtitanGateRunner, replicates: int = REPLICATES,
             faults: tuple[str, ...] = (), max_gpu_hours: float | None = None,
             noise: float = 0.0) -> tuple[ConvergenceVerdict | None, str]:
    """Gate runs + the convergence check, doubling the steps while the verdict asks for more and
    `max_gpu_hours` (what the campaign can still pay) allows. Returns (verdict, "") or (None, why
    no verdict: a run that failed, or more steps than the budget pays for)."""
    manifest = {"tier": "numerics" if config.numerics_change else "exact",
                "numerics_change": [n.field for n in config.numerics_change], "trainer": "torchtitan"}
    max_steps = steps * 2 ** MAX_DOUBLINGS
    spent_before = runner.gpu_hours
    while True:
        plan = plan_runs(baseline, candidate, steps, seed, replicates, faults, noise)
        round_before = runner.gpu_hours
        results = {name: runner.run(run, name) for name, run in plan.items()}
        failed = [(name, r) for name, r in results.items() if not r.ok]
        if failed:
            name, r = failed[0]
            return None, f"gate run {name} did not finish {steps} steps: {r.message} (log {r.log})"
        info = {name: {"recipe": run.recipe.name, "order_dp": run.order_dp, "faults": list(run.faults),
                       "seed": run.seed, "noise": run.noise, "noise_seed": run.noise_seed, "seconds": round(results[name].seconds, 1),
                       "gpu_hours": round(results[name].gpu_hours, 5)} for name, run in plan.items()}
        curves = {n: (r.rows, r.step1) for n, r in results.items() if n != SEED}   # the seed trains nothing
        folder = write_folder(Path(workdir) / "curves", curves, manifest, info)
        verdict = check_convergence(folder, workdir, max_steps=max_steps)
        if verdict.verdict == "inconclusive" and verdict.need_more_steps is not None:
            # the longer runs start from step 1 again: they cost this round's runs times the step ratio
            next_cost = (runner.gpu_hours - round_before) * verdict.need_more_steps / steps
            spent = runner.gpu_hours - spent_before
            if max_gpu_hours is not None and spent + next_cost > max_gpu_hours:
                return None, (f"the check needs {verdict.need_more_steps} steps to decide, about {next_cost:.3g} "
                              f"GPU-hours more than the {max_gpu_hours - spent:.3g} the budget has left")
            steps = verdict.need_more_steps
            continue
        return verdict, ""


def verify(baseline: Recipe, candidate: Recipe, workdir: Path, stack: TorchtitanStack | None = None,
           steps: int | None = None, replicates: int = REPLICATES, seed: int = 0,
           runner: TorchtitanGateRunner | None = None, say: Callable[[str], None] | None = None,
           max_gpu_hours: float | None = None) -> GateReport:
    """The gate on the torchtitan stack: config check, then real torchtitan curves (at most
    `max_gpu_hours` of them: no verdict, so no pass, past it)."""
    start = time.perf_counter()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config = check_config(baseline, candidate)
    if not config.passed:
        return GateReport(passed=False, config=config, note="config check failed: no gate runs were made",
                          seconds=round(time.perf_counter() - start, 2), trainer="torchtitan")
    runner = runner or TorchtitanGateRunner(stack or TorchtitanStack(), workdir, say)
    spent_before = runner.gpu_hours
    verdict, failure = converge(baseline, candidate, config, workdir, steps or DEFAULT_STEPS, seed, runner, replicates,
                                max_gpu_hours=max_gpu_hours)
    spent = runner.gpu_hours - spent_before
    if verdict is None:
        return GateReport(passed=False, verdict="inconclusive" if failure.startswith("the check needs") else "failed",
                          config=config, note=f"no verdict: {failure}", trainer="torchtitan",
                          seconds=round(time.perf_counter() - start, 2), gpu_hours=spent)
    return GateReport(passed=verdict.passed, verdict=verdict.verdict, config=config, convergence=verdict,
                      steps_used=verdict.steps_used,
                      plot=verdict.plot, trainer="torchtitan", gpu_hours=spent,
                      note=f"torchtitan: {verdict.replicates} replicates, {verdict.mode}, tier {verdict.tier}",
                      seconds=round(time.perf_counter() - start, 2))
