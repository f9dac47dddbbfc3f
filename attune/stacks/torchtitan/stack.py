"""TorchtitanStack: the Stack protocol (attune/stacks/base.py) on real torchtitan 0.3 runs.

A trial is the recipe's launch plus trial settings: enough steps for warm-up and measurement,
metrics every step, no checkpoints, validation, profiling or TensorBoard, the given seed, the LR
schedule pinned to the recipe's full length (so a 30-step trial sees the recipe's schedule, not
one squeezed into 30 steps), the resolved config saved, and outputs under the trial's workdir. It
is validated with torchtitan's ConfigManager first where torchtitan imports, so a bad override
costs no GPU time. After the run the layout it ran is read back from that config and its log
(readback.py): a run that trained another layout than the trial's is a `layout_mismatch`, whose
message names both, never a measurement of the layout asked for.

Where it runs is the executor's business: by default a local subprocess (runner.run_process, a
one-node cluster); deployment.pool_executor runs it as a Prefect deployment on a GPU work pool.
Charging: the cluster's GPUs x the run's wall time, start-up and compilation included.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attune.errors import InputError
from attune.layout import AC_MODE, COMPILE
from attune.recipe import Recipe
from attune.stacks.base import TrialResult, TrialStatus
import attune.stacks.torchtitan.smoke_assets as smoke_assets
from attune.stacks.torchtitan import readback
from attune.stacks.torchtitan.log_parser import measured, median_or_none
from attune.stacks.torchtitan.recipe_values import recipe_values
from attune.stacks.torchtitan.render import Launch, canonical_config, on_cpu, render_launch
from attune.stacks.torchtitan.runner import RunLimits, RunOutcome, run_process
from attune.stacks.torchtitan.validate import torchtitan_available, validate_batch

# (launch, log path, limits, workdir) -> outcome. Local by default; see deployment.pool_executor.
Executor = Callable[[Launch, Path, RunLimits, Path], RunOutcome]

# Conservative planning figures for estimate_wall_time_s (a budget check must not underestimate); a
# campaign corrects them by what its runs measure (attune.campaign.costs).
STARTUP_S, COMPILE_S, INIT_S_PER_B_PARAMS = 120.0, 240.0, 0.5
# The debug model on 2 cores: start-up measured 18-22 s (the CPU benchmark's sweeps); compilation about
# 60 s with a cold inductor cache and 1-2 s with a warm one (the sweeps: mean wall 23.6 s compiled, 22.1 s eager)
CPU_STARTUP_S, CPU_COMPILE_S = 30.0, 60.0
MFU_FLOOR = 0.15
RECOMPUTE_FACTOR = {"none": 1.0, "selective": 1.15, "full": 4.0 / 3.0, "memory-budget": 1.2}


def _seconds(variable: str, default: float) -> float:
    text = os.environ.get(variable, "")
    try:
        value = float(text) if text else default
    except ValueError:
        raise InputError(variable, f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(variable, f"must be a positive number of seconds, got {text!r}")
    return value


def local_executor(launch: Launch, log_path: Path, limits: RunLimits, workdir: Path) -> RunOutcome:
    if launch.nnodes > 1:
        return RunOutcome(status=TrialStatus.CRASH, returncode=None, wall_time_s=0.0, steps=[],
                          message=f"a {launch.nnodes}-node launch needs a work pool (deployment.pool_executor)",
                          log_path=str(log_path))
    return run_process(launch.argv, launch.env, log_path, limits, cwd=workdir)


class TorchtitanStack:
    """Trials on torchtitan 0.3. smoke_assets=True points runs at the shipped offline tokenizer and
    text (no hub needed); validate: "auto" (when torchtitan imports here), True or False."""

    name = "torchtitan"

    def __init__(self, *, executor: Executor | None = None, deployment: str | None = None,
                 launcher: str | None = None, warmup_steps: int = 3, smoke_assets: bool | None = None,
                 validate: bool | str = "auto", startup_timeout_s: float | None = None,
                 stall_timeout_s: float | None = None,
                 rdzv_endpoint: str | None = None, env: dict[str, str] | None = None,
                 extra_config: dict[str, Any] | None = None, pool: str | None = None, quiet: bool = False):
        # A campaign builds the stack from its stack_options (pool, quiet: the flow's); where those
        # cannot say it, the environment does: ATTUNE_TORCHTITAN_DEPLOYMENT (run trials as runs of
        # that Prefect deployment), ATTUNE_TORCHTITAN_LAUNCHER (k8s | slurm | direct) and
        # ATTUNE_TORCHTITAN_SMOKE_ASSETS=1 (the shipped offline tokenizer and text),
        # ATTUNE_TORCHTITAN_STARTUP_TIMEOUT_S / _STALL_TIMEOUT_S (seconds without a first / a next
        # step before a trial counts as hung: 1800 and 600 by default).
        deployment = deployment or os.environ.get("ATTUNE_TORCHTITAN_DEPLOYMENT")
        launcher = launcher or os.environ.get("ATTUNE_TORCHTITAN_LAUNCHER", "k8s")
        if executor is None and deployment:
            from attune.stacks.torchtitan.deployment import pool_executor
            executor = pool_executor(deployment, launcher)
        self.deployment, self.launcher = (deployment, launcher) if executor is None or deployment else (None, None)
        self.executor = executor or local_executor
        self.pool, self.quiet = pool, quiet
        self.warmup_steps = warmup_steps
        if smoke_assets is None and os.environ.get("ATTUNE_TORCHTITAN_SMOKE_ASSETS", ""):
            smoke_assets = os.environ["ATTUNE_TORCHTITAN_SMOKE_ASSETS"] not in ("0", "false")
        self.smoke_assets = smoke_assets  # None: on for CPU clusters (no hub there), off elsewhere
        self.validate = validate
        self.startup_timeout_s = startup_timeout_s or _seconds("ATTUNE_TORCHTITAN_STARTUP_TIMEOUT_S", 1800.0)
        self.stall_timeout_s = stall_timeout_s or _seconds("ATTUNE_TORCHTITAN_STALL_TIMEOUT_S", 600.0)
        # Trials on a work pool get their rendezvous endpoint from the job (PET_RDZV_ENDPOINT).
        self.rdzv_endpoint = rdzv_endpoint or ("env" if deployment else None)
        self.env = dict(env or {})
        self.extra_config = dict(extra_config or {})
        self._validated: set[str] = set()

    def preflight(self, recipe: Recipe) -> None:
        """Refuse, before any GPU-hour is spent, a work pool that cannot run this recipe's trials
        (InputError naming what is missing); nothing to check for local runs."""
        if self.deployment:
            from attune.stacks.torchtitan.pool_preflight import check_pool
            check_pool(self.deployment, self.launcher, recipe.cluster.gpus // recipe.cluster.node_size)

    # ---- the launch ----------------------------------------------------------------------

    def trial_config(self, recipe: Recipe, steps: int, seed: int, workdir: Path) -> dict[str, Any]:
        """Settings a trial adds on top of the recipe's [config]."""
        config = canonical_config(dict(recipe.config))
        own = recipe_values(*self._module_config(recipe)) or {}
        full_length = config.get("training.steps", own.get("training.steps"))
        extra: dict[str, Any] = {
            "training.steps": self.warmup_steps + steps, "metrics.log_freq": 1,
            "metrics.enable_tensorboard": False, "metrics.enable_wandb": False, "checkpoint.enable": False,
            "validator.enable": False, "profiler.enable_profiling": False, "debug.seed": seed,
            "dump_folder": str(Path(workdir) / "outputs"), "debug.save_config_file": readback.CONFIG_FILE,
        }
        if full_length and "lr_scheduler.total_steps" not in config:
            extra["lr_scheduler.total_steps"] = int(full_length)
        if self.uses_smoke_assets(recipe):
            extra |= smoke_assets.materialize(Path(workdir) / "assets")
        return extra | self.extra_config

    def uses_smoke_assets(self, recipe: Recipe) -> bool:
        return on_cpu(recipe) if self.smoke_assets is None else self.smoke_assets

    def launch(self, recipe: Recipe, steps: int, seed: int, workdir: Path) -> Launch:
        workdir = Path(workdir).resolve()  # the trainer runs with workdir as its cwd: relative paths would double
        env = dict(self.env)
        if self.uses_smoke_assets(recipe):
            env |= smoke_assets.OFFLINE_ENV | {"HF_DATASETS_CACHE": str(Path(workdir) / "hf_datasets_cache")}
        # torchrun's own logs stay with the trial (else a /tmp/torchelastic_* folder per run, never removed)
        return render_launch(recipe, extra=self.trial_config(recipe, steps, seed, workdir), env=env,
                             rdzv_endpoint=self.rdzv_endpoint, rdzv_id=f"attune-{recipe.name}-{seed}",
                             log_dir=str(workdir / "torchelastic"))

    @staticmethod
    def _module_config(recipe: Recipe) -> tuple[str, str]:
        if recipe.torchtitan is None:
            raise InputError(f"{recipe.name}: torchtitan", "the recipe has no [torchtitan] module/config to launch")
        return recipe.torchtitan.module, recipe.torchtitan.config

    # ---- the Stack protocol --------------------------------------------------------------

    def estimate_wall_time_s(self, recipe: Recipe, steps: int) -> float:
        """The prior: start-up (+ compile) + (warm-up + steps) x a step at a low MFU. What runs
        measured corrects it in the campaign (attune.campaign.costs), not here: a stack's estimate is
        the same before and after any run, so a campaign can tell how far it was off."""
        layout, arch, part = recipe.layout(), recipe.architecture, recipe.cluster.part
        n_steps = self.warmup_steps + steps
        peak = (part.peak_fp8_tflops if layout.float8 != "none" and part.supports_float8 else part.peak_bf16_tflops)
        flops = 6.0 * arch.active_params * layout.tokens_per_step * RECOMPUTE_FACTOR.get(layout.ac_mode, 4.0 / 3.0)
        step_s = flops / (recipe.cluster.gpus * peak * 1e12 * MFU_FLOOR)
        base_s, compile_s = (CPU_STARTUP_S, CPU_COMPILE_S) if on_cpu(recipe) else (STARTUP_S, COMPILE_S)
        startup = base_s + INIT_S_PER_B_PARAMS * arch.total_params / 1e9 + (compile_s if layout.compile else 0.0)
        return startup + n_steps * step_s

    def run_trial(self, recipe: Recipe, steps: int, seed: int, workdir: Path) -> TrialResult:
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        levers = recipe.layout().levers()
        try:
            launch = self.launch(recipe, steps, seed, workdir)
            self._check(launch, self._key(recipe))
        except InputError as err:  # rejected before any GPU time: charged nothing
            return TrialResult(status=TrialStatus.CRASH, stack=self.name, levers=levers, gpus=recipe.cluster.gpus,
                               wall_time_s=0.0, simulated=False, message=f"rejected before launch: {err}")
        (workdir / "launch.json").write_text(json.dumps(launch.payload(), indent=2))
        limits = RunLimits(measure_steps=steps, warmup_steps=self.warmup_steps,
                           startup_timeout_s=self.startup_timeout_s, stall_timeout_s=self.stall_timeout_s)
        outcome = self.executor(launch, workdir / "train.log", limits, workdir)
        return self._result(recipe, self.checked(recipe, outcome, workdir), levers, launch)

    @staticmethod
    def ran_config(workdir: Path) -> Path:
        """Where torchtitan saves the config it resolved (dump_folder / debug.save_config_file)."""
        return Path(workdir) / "outputs" / readback.CONFIG_FILE

    def checked(self, recipe: Recipe, outcome: RunOutcome, workdir: Path) -> RunOutcome:
        """The outcome, or a layout_mismatch naming what ran and what was asked for (readback.py).
        A run that resolved no layout (failed before) keeps its own status; an ok run must show one."""
        error = readback.check(recipe.layout(), self.ran_config(workdir), outcome.log_path,
                               complete=outcome.status == TrialStatus.OK)
        if error is None:
            return outcome
        return outcome.model_copy(update={"status": TrialStatus.LAYOUT_MISMATCH, "message": error})

    # ---- helpers -------------------------------------------------------------------------

    def _check(self, launch: Launch, recipe_key: str) -> None:
        if self.validate is False or (self.validate == "auto" and not torchtitan_available()):
            return
        if recipe_key not in self._validated:  # replicates differ only in seed and folders: check once
            error = validate_batch([launch.train_args])[0]
            if error:
                raise InputError("torchtitan ConfigManager", error)
            self._validated.add(recipe_key)

    def _key(self, recipe: Recipe) -> str:
        return json.dumps([recipe.cluster.label, sorted(canonical_config(dict(recipe.config)).items())], default=str)

    def _result(self, recipe: Recipe, outcome: RunOutcome, levers: dict[str, Any], launch: Launch) -> TrialResult:
        # a run of another layout measured nothing about this one
        timed = [] if outcome.status == TrialStatus.LAYOUT_MISMATCH else measured(outcome.steps, self.warmup_steps)
        tps = median_or_none([s.tps for s in timed])
        mfu = median_or_none([s.mfu for s in timed])
        memory = [s.memory_gib for s in outcome.steps if s.memory_gib is not None and math.isfinite(s.memory_gib)]
        step_time = recipe.layout().tokens_per_step / (tps * recipe.cluster.gpus) if tps else None
        message = outcome.message
        if outcome.status == TrialStatus.OK and not timed:
            message = f"{message}; no step after the {self.warmup_steps} warm-up steps to measure"
        return TrialResult(
            status=outcome.status, stack=self.name, levers=levers, gpus=recipe.cluster.gpus,
            wall_time_s=outcome.wall_time_s, tokens_per_sec_per_gpu=tps, mfu=mfu, step_time_s=step_time,
            peak_memory_gib=max(memory) if memory else None, steps=outcome.steps, simulated=False, message=message,
            breakdown={"hbm_gib": recipe.cluster.memory_gib, "measured_steps": len(timed),
                       "warmup_steps": self.warmup_steps, "log": outcome.log_path, "argv": launch.argv,
                       "ac_mode": levers.get(AC_MODE), "compile": levers.get(COMPILE)}
            | ({"allocation": outcome.allocation, "allocation_s": outcome.allocation_s} if outcome.allocation else {}))
