"""Read the data files shipped in attune/data (TOML), cached: they never change in a process."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

from attune.errors import InputError

DATA_DIR = Path(__file__).parent / "data"


@functools.cache
def load_data(name: str) -> dict:
    """Parsed contents of attune/data/<name>.toml."""
    return read_toml(DATA_DIR / f"{name}.toml")


def read_toml(path: Path | str) -> dict:
    """Parse a TOML file; a missing or malformed file is an InputError naming the path."""
    path = Path(path)
    if not path.is_file():
        raise InputError(str(path), "file not found")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise InputError(str(path), f"not valid TOML ({err})") from None
