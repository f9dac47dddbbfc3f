"""Where ATTUNE keeps its files and how it writes them.

$ATTUNE_HOME (default ./.attune) holds campaigns, the MLflow SQLite file, the recipe store, the gate's
cache. Every file a reader may open while it is being written is written
whole to a temp file beside it and renamed over it, so a reader sees the old file or the new one,
never half of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def attune_home() -> Path:
    return Path(os.environ.get("ATTUNE_HOME") or ".attune").resolve()


def atomic_write_text(path: Path | str, text: str) -> Path:
    """Write `text` to `path` through a temp file (unique to this process) and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def try_lock(lock_path: Path | str):
    """An open file holding an exclusive lock on `lock_path` (created if missing), or None when
    another process holds it. Closing the file lets go; the kernel lets go when the holder dies,
    so a killed process never leaves a lock held."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


@contextlib.contextmanager
def locked(lock_path: Path | str) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` while the block runs: processes that share a file take
    turns (waiting for each other)."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
