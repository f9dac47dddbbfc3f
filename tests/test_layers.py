"""The layer order of the README ("Layout of the code"): a module may import its own layer and the
layers below it, never one above. An AST scan of every import, at module level or inside a function:

    data -> domain -> campaign -> tasks -> flows -> cli

The sim-honesty scan (tests/test_sim_honesty.py) is the same idea for one module, the ground truth.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("attune", "flows", "tasks", "gate", "lessons")

# Each layer by the module prefixes it holds; the longest matching prefix decides.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("data", ("attune.data", "attune.data_files", "attune.errors", "attune.files")),
    ("domain", ("attune.spec", "attune.recipe", "attune.layout", "attune.levers", "attune.space",
                "attune.validation", "attune.sim", "attune.proxy", "attune.stacks", "attune.store",
                "attune.leaderboard", "gate", "lessons")),
    ("campaign", ("attune.campaign", "attune.planners", "attune.tracking", "attune.nightly", "attune.bench")),
    ("tasks", ("tasks",)),
    ("flows", ("flows",)),
    ("cli", ("attune.cli", "attune")),
]


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def imported(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every absolute import in the file (relative ones stay inside a package)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.module, node.lineno))
    return found


def upward_imports() -> list[str]:
    offenders = []
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*.py")):
            own = layer_of(module_name(path))
            assert own is not None, f"{path}: in no layer (add its package to LAYERS and the README)"
            for module, line in imported(path):
                theirs = layer_of(module)
                if theirs is not None and theirs > own:
                    offenders.append(f"{path.relative_to(REPO)}:{line} ({LAYERS[own][0]}) imports {module} "
                                     f"({LAYERS[theirs][0]})")
    return offenders


def test_no_module_imports_a_layer_above_its_own():
    offenders = upward_imports()
    assert not offenders, "\n".join(offenders)


def test_the_scan_sees_an_upward_import(tmp_path):
    """The scan itself can fail: a domain module that imports a flow is caught."""
    fake = REPO / "attune" / "sim" / "_layer_probe.py"
    fake.write_text("def f():\n    from flows.campaign import tune_campaign\n")
    try:
        assert any("_layer_probe.py:2 (domain) imports flows.campaign (flows)" in o for o in upward_imports())
    finally:
        fake.unlink()


def test_every_package_has_a_layer_and_the_readme_names_it():
    readme = (REPO / "README.md").read_text()
    for folder in SCANNED:
        for init in (REPO / folder).rglob("__init__.py"):
            package = module_name(init)
            assert layer_of(package) is not None, package
            assert f"`{package.replace('.', '/')}/`" in readme, f"the README's layout table does not name {package}"
