"""Read the data files shipped in attune/data (TOML), cached: they never change in a process."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

from attune.errors import InputError

DATA_DIR = Path(__file__).parent / "data"
# Recipes and specs are a page of text; a file this big is a wrong path (a checkpoint, a data set).
MAX_TEXT_BYTES = 1 << 20


@functools.cache
def load_data(name: str) -> dict:
    """Parsed contents of attune/data/<name>.toml."""
    return read_toml(DATA_DIR / f"{name}.toml")


def read_text(path: Path | str, what: str = "file", max_bytes: int = MAX_TEXT_BYTES) -> str:
    """A user's text file (a recipe, a spec), or an InputError naming the path and why it is not one:
    missing, a folder, too big, not UTF-8 (a binary file must not end in a decode traceback)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(str(path), f"is a directory, not a {what}")
    if not path.is_file():
        raise InputError(str(path), f"{what} not found")
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(str(path), f"{size:,} bytes: a {what} is at most {max_bytes:,} bytes "
                                    f"({max_bytes / (1 << 20):g} MiB)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(str(path), f"not UTF-8 text (byte {err.object[err.start:err.start + 1]!r} at offset "
                                    f"{err.start}): a {what} is UTF-8 text") from None


def read_toml(path: Path | str, what: str = "file") -> dict:
    """Parse a TOML file; a missing, unreadable or malformed file is an InputError naming the path."""
    text = read_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InputError(str(path), f"not valid TOML ({err})") from None
