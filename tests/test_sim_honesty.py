"""Planners see measured trials and the public estimator, never the simulated ground truth.

An AST scan: only the ground truth itself, the oracle, the sim stack, the sim CLI and the benchmark's
evaluator (attune/bench/truth.py, which scores shipped layouts) may import
attune.sim.ground_truth, in any form (import x, from x import y, from attune.sim import
ground_truth, importlib.import_module("...")).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("attune", "flows", "tasks", "gate", "lessons")
ALLOWED = {"attune/sim/ground_truth.py", "attune/sim/oracle.py", "attune/stacks/sim.py", "attune/cli/cmd_sim.py",
           "attune/sim/fidelity.py",   # measures the estimator against the truth for a report, never plans
           "attune/bench/truth.py"}    # the benchmark's evaluator: scores shipped layouts, never plans
TARGET = "attune.sim.ground_truth"


def _package_of(path: Path) -> str:
    """The package a module belongs to (for x/y/z.py and x/y/__init__.py alike: x.y)."""
    return ".".join(path.relative_to(REPO).parts[:-1])


def _resolve(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([p for p in base if p] + ([node.module] if node.module else []))


def imports_ground_truth(path: Path, package: str | None = None) -> list[int]:
    """Line numbers where the file reaches attune.sim.ground_truth."""
    package = package if package is not None else _package_of(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(a.name == TARGET or a.name.startswith(TARGET + ".") for a in node.names):
                hits.append(node.lineno)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, package)
            if module == TARGET or module.startswith(TARGET + "."):
                hits.append(node.lineno)
            elif module == "attune.sim" and any(a.name == "ground_truth" for a in node.names):
                hits.append(node.lineno)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__") and str(node.args[0].value).startswith(TARGET):
                hits.append(node.lineno)
    return hits


def test_only_the_oracle_the_sim_stack_and_the_sim_cli_import_the_ground_truth():
    offenders = []
    for folder in SCANNED:
        root = REPO / folder
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in ALLOWED:
                continue
            for line in imports_ground_truth(path):
                offenders.append(f"{rel}:{line}")
    assert not offenders, f"these files import the simulated ground truth: {offenders}"


def test_the_scan_sees_every_import_form(tmp_path):
    forms = ["import attune.sim.ground_truth\n", "from attune.sim.ground_truth import measure\n",
             "from attune.sim import ground_truth\n", "from . import ground_truth\n", "from .ground_truth import measure\n",
             "import importlib\nimportlib.import_module('attune.sim.ground_truth')\n"]
    for i, text in enumerate(forms):
        probe = tmp_path / f"probe_{i}.py"   # read as if it lived in attune/sim/
        probe.write_text(text)
        assert imports_ground_truth(probe, package="attune.sim"), text
    (tmp_path / "other.py").write_text("from ..sim.ground_truth import measure\n")
    assert imports_ground_truth(tmp_path / "other.py", package="attune.planners")
    assert not imports_ground_truth(REPO / "attune" / "sim" / "estimator.py")


def test_simulated_results_say_so():
    from attune.sim.estimator import estimate
    from attune.recipe import recipe_from_dict

    recipe = recipe_from_dict({"name": "t", "model": "llama3.1-8b", "cluster": {"accelerator": "h100", "gpus": 8},
                               "stack": {"torch": "2.13.0", "torchtitan": "0.3.0"},
                               "config": {"training.local_batch_size": 1, "training.seq_len": 4096}})
    result = estimate(recipe)
    assert result.simulated is True and result.source == "estimator"
