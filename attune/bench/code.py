"""Which code a benchmark ran: one digest of the sources its campaigns import.

A benchmark runs the code on disk: the `attune` package and the packages installed beside it
(attune.gate, attune.lessons, attune.tasks, attune.flows; an editable install maps them to the
checkout, whatever PYTHONPATH says). Its worker processes import modules when they first need them,
and the budget curve starts one `attune bench` per share, so a source edited while a benchmark runs
ends up in some of its campaigns and not others: the curve's 1/4 share of 2026-12-07 ran an
experiment (a lesson's prior only on layouts that make its move alone) that was reverted before
its 1/2 share started, and its cells could not be reproduced with the code committed. The digest is
taken before the first campaign and after the last; a benchmark during which it changed says so.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

PACKAGES = ("attune", "attune.gate", "attune.lessons", "attune.tasks", "attune.flows")
SUFFIXES = (".py", ".toml")


def _files(root: Path) -> list[Path]:
    out = []
    for folder, dirs, names in os.walk(root):   # links to folders are not followed (a package's own folder only)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out += [Path(folder) / n for n in sorted(names) if n.endswith(SUFFIXES)]
    return out


def code_digest(packages: tuple[str, ...] = PACKAGES) -> str:
    """A digest of every .py and .toml file of these packages, where this interpreter imports them from."""
    digest = hashlib.sha256()
    for name in packages:
        spec = importlib.util.find_spec(name)
        for root in (spec.submodule_search_locations or []) if spec else []:
            for path in _files(Path(root)):
                digest.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@contextmanager
def watched(packages: tuple[str, ...] = PACKAGES) -> Iterator[dict]:
    """Around a benchmark's campaigns (`attune bench`'s worker pool, the CPU benchmark, the re-tunes,
    the lessons): yields {"digest"}, and adds "after" and "changed_during_run" when the block ends,
    with a warning on stderr if they differ (a module imported late would have run the edit)."""
    record = {"digest": code_digest(packages)}
    yield record
    after = code_digest(packages)
    record.update(after=after, changed_during_run=after != record["digest"])
    if after != record["digest"]:
        print(f"[bench] WARNING: the code changed while the benchmark ran (digest {record['digest']} -> {after}): "
              f"rerun it on a checkout nobody edits", file=sys.stderr, flush=True)
