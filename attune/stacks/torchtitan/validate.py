"""Validate rendered launches with torchtitan's own ConfigManager before any GPU time is spent.

Runs in a subprocess (this file's `main`): torchtitan's CLI exits the process on a bad option
(tyro prints a box and raises SystemExit 2), its imports patch global torch state, and float8
recipes need a stand-in GPU capability on a CPU machine; none of that belongs in the caller.
One subprocess validates a whole batch: the first parse costs seconds (imports, recipe build),
later ones a tenth of a second.

Beyond ConfigManager.parse_args the child replays what the trainer does to the config before
building anything: the model's update_from_config (tp must divide the heads, seq_len within the
RoPE range, EP dispatcher set-up), the --override.imports overrides (our float8 factories), and
the CUDA-graph check that runs after them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from typing import Any

from attune.errors import InputError

RESULT_MARK = "ATTUNE-VALIDATE-RESULT "
_BOX_CHARS = "│╭╮╰╯─┃━"  # rich draws these, or ASCII dashes when stderr is not a terminal


def torchtitan_available() -> bool:
    return importlib.util.find_spec("torchtitan") is not None


def validate_batch(batch: list[list[str]], python: str | None = None, timeout_s: float = 600) -> list[str | None]:
    """For each list of torchtitan.train arguments: None if torchtitan accepts it, else one line."""
    if not batch:
        return []
    env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    try:
        proc = subprocess.run([python or sys.executable, "-m", "attune.stacks.torchtitan.validate"],
                              input=json.dumps(batch), capture_output=True, text=True, timeout=timeout_s,
                              env=env)
    except subprocess.TimeoutExpired:
        raise InputError("torchtitan validation", f"ConfigManager did not answer within {timeout_s:.0f} s") from None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise InputError("torchtitan validation", f"validator exited {proc.returncode}: {tail}")


def validate_train_args(train_args: list[str], origin: str = "recipe") -> None:
    """InputError (one line, naming torchtitan's complaint) unless torchtitan accepts the launch."""
    error = validate_batch([train_args])[0]
    if error:
        raise InputError(f"{origin}: torchtitan rejected the launch", error)


# ---- the child process -------------------------------------------------------------------------

def one_line(text: str) -> str:
    """The message of a tyro error box (the lines between its first two rules, unwrapped), else
    the text's first non-empty line; always one line."""
    lines = [raw.strip().strip(_BOX_CHARS).strip() for raw in text.splitlines()]
    rules = [i for i, line in enumerate(lines) if line and set(line) <= set(_BOX_CHARS + "-")]
    if rules:
        stop = next((i for i in rules if i > rules[0]), len(lines))
        body = [line for line in lines[rules[0] + 1:stop] if line]
    else:
        body = [line for line in lines if line][:1]
    return re.sub(r"\s+", " ", " ".join(body) or "rejected")[:400]


def _check(args: list[str]) -> str | None:
    from torchtitan.config import ConfigManager, apply_overrides
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            config = ConfigManager().parse_args(list(args))
            config.model_spec.model.update_from_config(config=config)
            if config.override.imports:
                apply_overrides(config.override, config)
            config._validate_cuda_graphs()
    except SystemExit as err:
        return one_line(captured.getvalue()) if err.code else None
    except Exception as err:  # torchtitan's own checks raise ValueError, NotImplementedError, ...
        message = err.args[0] if err.args and isinstance(err.args[0], str) else str(err)
        return f"{type(err).__name__}: {one_line(message)}"
    return None


def main() -> int:
    batch: list[list[str]] = json.loads(sys.stdin.read())
    import logging
    logging.disable(logging.WARNING)  # torchtitan warns about missing HF assets: not our concern here
    import torch
    from attune.stacks.torchtitan.recipe_values import pretend_float8_hardware
    if not torch.cuda.is_available():
        pretend_float8_hardware()
    results: list[Any] = [_check(args) for args in batch]
    sys.stdout.write(RESULT_MARK + json.dumps(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
