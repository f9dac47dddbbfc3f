"""The layer order of docs/architecture.md ("Layout of the code", moved there from the README): a module may import its own layer and the
layers below it, never one above. An AST scan of every import, at module level or inside a function:

    data -> domain -> campaign -> tasks -> flows -> cli

The sim-honesty scan (tests/test_sim_honesty.py) is the same idea for one module, the ground truth.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("attune", "flows", "tasks", "gate", "lessons")
# The design's top-level folders install inside the one distribution namespace (pyproject.toml).
NAMESPACED = {"gate": "attune.gate", "lessons": "attune.lessons", "tasks": "attune.tasks", "flows": "attune.flows"}

# Each layer by the module prefixes it holds; the longest matching prefix decides.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("data", ("attune.data", "attune.data_files", "attune.errors", "attune.files", "attune.interrupt")),
    ("domain", ("attune.spec", "attune.recipe", "attune.layout", "attune.levers", "attune.space",
                "attune.validation", "attune.sim", "attune.proxy", "attune.stacks", "attune.store",
                "attune.leaderboard", "attune.gate", "attune.lessons")),
    ("campaign", ("attune.campaign", "attune.planners", "attune.tracking", "attune.nightly", "attune.bench")),
    ("tasks", ("attune.tasks",)),
    ("flows", ("attune.flows",)),
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
    """The module's import name: gate/x.py is attune.gate.x (NAMESPACED)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    parts[0] = NAMESPACED.get(parts[0], parts[0])
    return ".".join(parts).removesuffix(".__init__")


def project_modules() -> set[str]:
    return {module_name(path) for folder in SCANNED for path in (REPO / folder).rglob("*.py")}


def imported(path: Path, modules: set[str] | None = None) -> list[tuple[str, int]]:
    """(module, line) of every absolute import in the file (relative ones stay inside a package);
    `from p import m` of a project submodule m counts as an import of p.m, not of p."""
    modules = project_modules() if modules is None else modules
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            subs = [f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in modules]
            found += [(sub, node.lineno) for sub in subs] or [(node.module, node.lineno)]
    return found


def upward_imports() -> list[str]:
    offenders, modules = [], project_modules()
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*.py")):
            own = layer_of(module_name(path))
            assert own is not None, f"{path}: in no layer (add its package to LAYERS and docs/architecture.md)"
            for module, line in imported(path, modules):
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
    fake.write_text("def f():\n    from attune.flows.campaign import tune_campaign\n")
    try:
        assert any("_layer_probe.py:2 (domain) imports attune.flows.campaign (flows)" in o for o in upward_imports())
    finally:
        fake.unlink()


def test_every_package_has_a_layer_and_the_layout_doc_names_it():
    readme = (REPO / "docs" / "architecture.md").read_text()
    for folder in SCANNED:
        for init in (REPO / folder).rglob("__init__.py"):
            package = module_name(init)
            folder_name = init.parent.relative_to(REPO).as_posix()
            assert layer_of(package) is not None, package
            assert f"`{folder_name}/`" in readme, f"docs/architecture.md's layout table does not name {folder_name}"


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at module level or inside a function (a package
    import counts as one of the package's __init__; `from p import m` of a submodule as one of m)."""
    modules = {module_name(path): path for folder in SCANNED for path in (root / folder).rglob("*.py")}

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in modules:
                return ".".join(parts[:end])
        return None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [s for s in subs if s in modules] or [node.module]
            for target in filter(None, map(resolve, targets)):
                if target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_remains():
    assert cycles(import_graph()) == []


def test_the_cycle_scan_sees_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_nothing_imports_the_folders_by_their_bare_names_and_the_install_lists_every_package():
    """gate/, lessons/, tasks/ and flows/ are attune.gate, ... once installed: an import of the bare
    name works only from the repo's root and never in an installed copy."""
    import tomllib

    bare = [f"{module_name(path)}:{line} imports {module}" for folder in SCANNED
            for path in sorted((REPO / folder).rglob("*.py")) for module, line in imported(path)
            if module.split(".")[0] in NAMESPACED]
    assert not bare, "\n".join(bare)
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(d / "__init__.py") for folder in SCANNED for d in [REPO / folder, *(REPO / folder).rglob("*")]
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))}
    assert folders <= listed, sorted(folders - listed)
