"""Where ATTUNE keeps its files and how it writes them.

$ATTUNE_HOME (default ./.attune) holds campaigns, the MLflow SQLite file, the recipe store, the gate's
cache and the lessons evidence. Every file a reader may open while it is being written is written
whole to a temp file beside it and renamed over it, so a reader sees the old file or the new one,
never half of one.
"""

from __future__ import annotations

import os
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
