"""The stack a recipe runs on tonight, and what changed since the last shipped recipe.

On the sim stack the recipe's [stack] section is the truth (there is no real environment to read).
On torchtitan the versions come from the environment the trials run in: torch and torchtitan as
installed, CUDA and NCCL as torch was built with them, and the driver from nvidia-smi where it exists.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from typing import Callable

from attune.errors import InputError
from attune.recipe import Recipe
from attune.spec import StackSpec


def environment_versions(nvidia_smi: Callable[[], str | None] | None = None) -> dict[str, str]:
    """Versions of this process's environment (the work pool's, when a worker runs it)."""
    try:
        import torch
    except ImportError:
        raise InputError("stack", "torch is not installed in this environment") from None
    try:
        torchtitan = importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        raise InputError("stack", "torchtitan is not installed in this environment") from None
    # The local label (+cu128, +cpu) repeats what the cuda field says; recipes write plain versions.
    versions = {"torch": torch.__version__.split("+")[0], "torchtitan": torchtitan}
    if torch.version.cuda:
        versions["cuda"] = str(torch.version.cuda)
        nccl = _nccl_version(torch)
        if nccl:
            versions["nccl"] = nccl
    driver = (nvidia_smi or driver_version)()
    if driver:
        versions["driver"] = driver
    return versions


def _nccl_version(torch) -> str | None:
    try:
        found = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL, or no CUDA runtime here: the field stays unset
        return None
    return ".".join(map(str, found)) if isinstance(found, tuple) else str(found)


def driver_version() -> str | None:
    """The NVIDIA driver version of GPU 0, or None where nvidia-smi is absent or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines[0] if out.returncode == 0 and lines else None


def detect_stack(stack: str, recipe: Recipe, versions: dict[str, str] | None = None) -> StackSpec:
    """Tonight's stack: the recipe's own on sim; the environment's (or `versions` read on the pool)."""
    if stack == "sim":
        return recipe.stack
    return StackSpec(**(versions if versions is not None else environment_versions()))


def stack_changes(before: dict[str, str | None], after: dict[str, str | None]) -> list[str]:
    """What changed, in words: ["torch 2.13.0 -> 2.14.0", "driver (none) -> 560.35.03"]."""
    out = []
    for key in ("torch", "torchtitan", "cuda", "nccl", "driver"):
        old, new = before.get(key), after.get(key)
        if old != new:
            out.append(f"{key} {old or '(none)'} -> {new or '(none)'}")
    return out
