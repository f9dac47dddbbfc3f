"""The proxy's injectable faults (attune/proxy/faults.toml): bugs a real stack has shipped, each
reproduced at run time with the recipe's config unchanged."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

FAULTS_FILE = Path(__file__).with_name("faults.toml")


@functools.cache
def fault_catalog() -> dict[str, dict]:
    return tomllib.loads(FAULTS_FILE.read_text())["faults"]


def fault_names() -> tuple[str, ...]:
    return tuple(fault_catalog())
