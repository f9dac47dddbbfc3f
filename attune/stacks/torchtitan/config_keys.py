"""The [config] keys a recipe may set (attune/data/config_keys.toml), and how that file is made.

A recipe's [config] holds torchtitan's dotted field names. A key torchtitan does not have is a typo
that would otherwise be shipped as written and never take effect, so the recipe loader refuses it
(attune.levers.check_config_key). The known keys are data, regenerated from the installed wheel with

    python -m attune.stacks.torchtitan.config_keys --write

as the union of
  - torchtitan 0.3's fields: every scalar, list and dict field of the Trainer.Config each recipe of
    recipe_values.MODULES builds (the model spec has no command-line fields and is left out);
  - torchtitan 0.2's names the gate classifies (gate/fields.toml) or field_aliases.toml maps to 0.3's;
  - ATTUNE's own keys (recipe_values: activation_checkpoint.mode, quantize.float8, ...).
The lever catalog's keys are added when the file is read. A test compares the shipped file with
the wheel wherever torchtitan imports. Reading the file needs no torchtitan.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import sys
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from attune.data_files import DATA_DIR
from attune.stacks.torchtitan.recipe_values import (AC_MODE, COMPILE_COMPONENTS, FLOAT8, MODULES, OPTIMIZER_KWARGS,
                                                    OPTIMIZER_PREFIX, OVERRIDE_IMPORTS, PLAIN_FIELDS,
                                                    pretend_float8_hardware)

KEYS_FILE = DATA_DIR / "config_keys.toml"
ALIASES_FILE = Path(__file__).with_name("field_aliases.toml")
SKIPPED = ("model_spec",)   # built in code (0.3 has no command-line fields for it)


def attune_keys() -> set[str]:
    """Keys ATTUNE itself reads, renders or classifies, whatever the wheel: recipe_values', the
    aliases' (both names) and the gate's."""
    from attune.gate.fields import FIELDS_FILE  # the gate's classification: torchtitan 0.2's names

    aliases = tomllib.loads(ALIASES_FILE.read_text())["aliases"]
    gate = tomllib.loads(FIELDS_FILE.read_text())["fields"]
    own = {AC_MODE, FLOAT8, COMPILE_COMPONENTS, OVERRIDE_IMPORTS, f"{OPTIMIZER_PREFIX}.optimizer_name",
           *(f"{OPTIMIZER_PREFIX}.optimizer_kwargs.{k}" for k in OPTIMIZER_KWARGS), *PLAIN_FIELDS}
    return own | set(aliases) | set(aliases.values()) | set(gate)


# ---- extraction from the installed wheel (needs torchtitan) ---------------------------------

def _fields(obj: Any, prefix: str = "") -> set[str]:
    """Dotted names of every leaf field of a config dataclass instance (lists of configs by index,
    dicts by key)."""
    out: set[str] = set()
    for f in dataclasses.fields(obj):
        if f.name in SKIPPED or f.name.startswith("_"):
            continue
        key, value = f"{prefix}{f.name}", getattr(obj, f.name, None)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out |= _fields(value, key + ".")
            continue
        out.add(key)
        if isinstance(value, dict):
            out |= {f"{key}.{k}" for k in value}
        elif isinstance(value, (list, tuple)):
            out |= {k for i, item in enumerate(value) if dataclasses.is_dataclass(item) and not isinstance(item, type)
                    for k in _fields(item, f"{key}.{i}.")}
    return out


def _ac_keys() -> set[str]:
    """activation_checkpoint is a subcommand in 0.3: the fields of every policy a recipe may pick."""
    from torchtitan.distributed.activation_checkpoint import FullAC, MemoryBudgetAC, SelectiveAC
    return {f"activation_checkpoint.{f.name}" for cls in (SelectiveAC, FullAC, MemoryBudgetAC)
            for f in dataclasses.fields(cls.Config)}


def wheel_keys() -> set[str]:
    """The fields of every recipe of recipe_values.MODULES that builds on this machine."""
    pretend_float8_hardware()
    out = _ac_keys()
    for module_name in MODULES:
        module = importlib.import_module(f"torchtitan.models.{module_name}.config_registry")
        for name, fn in sorted(inspect.getmembers(module, inspect.isfunction)):
            if fn.__module__ != module.__name__ or name.startswith("_") or inspect.signature(fn).parameters:
                continue
            try:
                config = fn()
            except Exception as err:  # a recipe that needs files or hardware we lack: left out
                print(f"skip {module_name}.{name}: {type(err).__name__}: {err}", file=sys.stderr)
                continue
            if hasattr(config, "model_spec") and hasattr(config, "training"):
                out |= _fields(config)
    return out


def all_keys() -> list[str]:
    """Leaf keys only: a section (activation_checkpoint where a recipe has none, a dict of kwargs)
    is not a value a recipe can set."""
    keys = wheel_keys() | attune_keys()
    return sorted(k for k in keys if not any(other.startswith(k + ".") for other in keys))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Dump the [config] keys a recipe may set.")
    parser.add_argument("--write", action="store_true", help=f"write {KEYS_FILE.name} (else print)")
    args = parser.parse_args(argv)
    header = ("# Generated by `python -m attune.stacks.torchtitan.config_keys --write` from the installed torchtitan\n"
              "# wheel, gate/fields.toml and field_aliases.toml: the [config] keys a recipe may set (the lever\n"
              "# catalog's keys are added when it is read). A key not here is refused with the nearest one named.\n")
    text = header + tomli_w.dumps({"keys": all_keys()}, multiline_strings=False)
    if args.write:
        KEYS_FILE.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
