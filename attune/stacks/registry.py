"""Stacks by name: `--stack sim|torchtitan|measured`. Imported lazily so the sim needs no torchtitan."""

from __future__ import annotations

from typing import Any

from attune.errors import InputError


def _sim(**options: Any):
    from attune.stacks.sim import SimStack
    return SimStack(**options)


def _torchtitan(**options: Any):
    from attune.stacks.torchtitan.stack import TorchtitanStack
    return TorchtitanStack(**options)


def _measured(**options: Any):
    from attune.stacks.measured import MeasuredStack
    return MeasuredStack(**options)


STACKS = {"sim": _sim, "torchtitan": _torchtitan, "measured": _measured}


def make_stack(name: str, **options: Any):
    if name not in STACKS:
        raise InputError("--stack", f"unknown stack {name!r}; choose from {', '.join(STACKS)}")
    return STACKS[name](**options)
