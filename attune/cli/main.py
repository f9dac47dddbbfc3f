"""Entry point of `attune`. Sub-commands are discovered: every attune/cli/cmd_*.py defines
`register(subparsers)`, so adding a command never means editing this file.

Bad input (attune.errors.InputError) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import attune.cli
from attune import __version__
from attune.errors import InputError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attune", description=(
        "Tune LLM training recipes inside a GPU-hour budget; ship only what the correctness gate verifies."))
    parser.add_argument("--version", action="version", version=f"attune {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(attune.cli.__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            importlib.import_module(f"attune.cli.{info.name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except InputError as err:
        print(f"attune: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attune: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
