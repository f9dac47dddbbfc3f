"""Shared fixtures: recipe files written to tmp_path, and the CLI run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

RECIPE_8B = """
name = "llama3_8b-test"
model = "llama3.1-8b"
[cluster]
accelerator = "h100"
gpus = 8
[stack]
torch = "2.13.0"
torchtitan = "0.3.0"
[torchtitan]
module = "llama3"
config = "llama3_8b"
[config]
"training.local_batch_size" = 2
"training.seq_len" = 8192
"optimizer.lr" = 3e-4
"activation_checkpoint.mode" = "selective"
"""

# The same Llama-3.1-8B recipe on 64 H100s: float8 runs there (A100s have none)
RECIPE_8B_H100 = """
name = "llama3_8b-h100"
model = "llama3.1-8b"
[cluster]
accelerator = "h100"
gpus = 64
[stack]
torch = "2.13.0"
torchtitan = "0.3.0"
[config]
"training.local_batch_size" = 2
"training.seq_len" = 8192
"optimizer.lr" = 3e-4
"activation_checkpoint.mode" = "selective"
"""


@pytest.fixture
def write_recipe(tmp_path):
    """write_recipe(text=RECIPE_8B, name="r.toml") -> path of a recipe file in tmp_path."""

    def _write(text: str = RECIPE_8B, name: str = "recipe.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return _write


@pytest.fixture
def cli(tmp_path):
    """cli(*args) -> CompletedProcess of `python -m attune.cli.main ARGS` (cwd = tmp_path)."""

    def _run(*args: str, check: bool = False, timeout: float = 300,
             env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=str(REPO), ATTUNE_HOME=str(tmp_path / ".attune"),
                   PREFECT_HOME=str(tmp_path / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
                   MPLBACKEND="Agg") | (env_extra or {})
        proc = subprocess.run([sys.executable, "-m", "attune.cli.main", *map(str, args)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"attune {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stderr}")
        return proc

    return _run


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Bad input: exit 2, one line on stderr naming the field, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert lines and lines[-1].startswith("attune: error:") or any("error" in ln for ln in lines), proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
