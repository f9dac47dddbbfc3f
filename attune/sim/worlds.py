"""Named worlds of the simulated cluster: how far a sibling cluster departs from the public model.

cluster_seed 0 is a cluster type's reference (the one public measurements pin); cluster_seed >= 1
are siblings whose hidden effects depart from it by the world's scale (attune/data/sim_hidden.toml,
[worlds] and [departure]). Only the ground truth applies departures; this module names the worlds
so that flags can be checked without reading the ground truth.
"""

from __future__ import annotations

from attune.data_files import load_data
from attune.errors import InputError

DEFAULT_WORLD = "realistic"


def world_names() -> list[str]:
    return list(load_data("sim_hidden")["worlds"])


def _world(name: str):
    worlds = load_data("sim_hidden")["worlds"]
    if name not in worlds:
        raise InputError("--world", f"unknown world {name!r}; choose from {', '.join(worlds)}")
    return worlds[name]


def world_scale(name: str) -> float:
    """The world's departure scale; InputError naming --world for an unknown one."""
    world = _world(name)
    return float(world["scale"] if isinstance(world, dict) else world)


def world_shift(name: str) -> dict[str, float]:
    """The hidden effects the world multiplies on every cluster, reference included (a stack upgrade
    that shifts one cost); none for most worlds."""
    world = _world(name)
    return {k: float(v) for k, v in world.get("shift", {}).items()} if isinstance(world, dict) else {}


def cluster_text(cluster_seed: int, world: str) -> str:
    """Which simulated cluster, as progress lines and results say it."""
    return "cluster_seed 0, the reference" if int(cluster_seed) == 0 else f"cluster_seed {cluster_seed}, world {world}"
