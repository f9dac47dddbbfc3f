"""The real stack: torchtitan 0.3.x launched through torchrun.

Files: render.py (recipe -> torchrun argv + env), recipe_values.py (what each torchtitan recipe
sets, as data), validate.py (torchtitan's own ConfigManager, in a subprocess), overrides.py
(torchtitan @override factories for the float8 lever; imported inside the training process),
log_parser.py, runner.py (subprocess, streaming, stop rules), stack.py (TorchtitanStack),
assets.py (offline tokenizer and text dataset for smoke runs), deployment.py (Prefect work pools).

Nothing here imports torchtitan at module load: ATTUNE renders and parses without it installed.
`TorchtitanStack` is imported lazily so that torchtitan's processes importing
attune.stacks.torchtitan.overrides do not pull in the rest of ATTUNE.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TorchtitanStack"]


def __getattr__(name: str) -> Any:
    if name == "TorchtitanStack":
        from attune.stacks.torchtitan.stack import TorchtitanStack
        return TorchtitanStack
    raise AttributeError(name)
