"""The import layers of docs/architecture.md, enforced: the table there is the contract.

Every module under runtime/ and operator/ is parsed (not imported); its module-level
imports (``TYPE_CHECKING`` blocks and function bodies excluded: those are lazy) must not
name anything in the "never imports" column of its layer's row.

Three rules count *every* import in the text (module level, ``TYPE_CHECKING``, function
bodies, relative): the project's import graph has no circle; ``torchjob.train`` never
imports ``torchjob.tune`` (tuning is the layer above training); and nothing imports a
private module of a dependency (``kopf._core...``), which any release may move.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = {
    "torchjob": REPO / "runtime" / "torchjob",
    "torchjob_operator": REPO / "operator" / "torchjob_operator",
}


def layer_table() -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(modules of the layer, modules they never import), from docs/architecture.md."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Layers and who imports whom", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        rows.append(
            (tuple(re.findall(r"`([\w.]+)`", cells[0])), tuple(re.findall(r"`([\w.]+)`", cells[2])))
        )
    return rows


def module_name(path: Path) -> str:
    for top, root in ROOTS.items():
        if root in path.parents or path.parent == root:
            rel = path.relative_to(root).with_suffix("")
            parts = [top, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    raise ValueError(path)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def module_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If) and not _is_type_checking(node):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return names


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_table_is_read() -> None:
    rows = layer_table()
    assert len(rows) >= 8
    assert any("torchjob.rules" in mods for mods, _ in rows)


def _modules() -> list[Path]:
    return sorted(p for root in ROOTS.values() for p in root.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: module_name(p))
def test_module_respects_its_layer(path: Path) -> None:
    name = module_name(path)
    rows = [(mods, never) for mods, never in layer_table() if any(_within(name, m) for m in mods)]
    if not rows:
        return  # e.g. the torchjob package's own __init__
    # The most specific row wins (torchjob_operator.planner over torchjob_operator).
    mods, never = max(rows, key=lambda r: max(len(m) for m in r[0] if _within(name, m)))
    imported = module_imports(path)
    bad = sorted(i for i in imported for n in never if _within(i, n) and not _within(name, n))
    assert not bad, f"{name} imports {bad}, which its layer ({', '.join(mods)}) never imports"


# --- every import in the text -----------------------------------------------------------


def _all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in _modules()}


def every_import(path: Path) -> Iterator[tuple[str, str]]:
    """(module, what is imported from it) for every import anywhere in ``path``: ``import m``
    gives (``m``, ""), ``from m import x`` gives (``m``, ``x``); relative ones are resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((a.name, "") for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield from ((module, a.name) for a in node.names)


def import_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (a name resolves to the longest
    module it is within: ``torchjob.train.config.RunConfig`` -> ``torchjob.train.config``)."""
    modules = _all_modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        # ``from torchjob.train import _session`` is an edge to the submodule, not to the
        # package (whose __init__ Python runs first in any case).
        targets = {resolve(f"{m}.{x}" if x else m) for m, x in every_import(path)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
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
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
                    circles.append(sorted(component))
    return circles


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"x": {"y"}, "y": set()}) == []


def test_the_import_graph_sees_lazy_and_type_checking_imports() -> None:
    graph = import_graph()
    # _prepare.py imports torch inside functions only, and the operator's __main__ imports
    # its handlers inside main(): both are edges.
    assert "torchjob_operator.handlers" in graph["torchjob_operator.__main__"]
    assert "torchjob.train._session" in graph["torchjob.train._prepare"]


def test_no_import_circles() -> None:
    circles = import_circles(import_graph())
    assert not circles, "import circles (every import counted, lazy ones too): " + "; ".join(
        " <-> ".join(c) for c in circles
    )


def test_train_never_imports_tune() -> None:
    bad = sorted(
        f"{name} imports {i}"
        for name, path in _all_modules().items()
        if _within(name, "torchjob.train")
        for i, _ in set(every_import(path))
        if _within(i, "torchjob.tune")
    )
    assert not bad, "training must not reach up into tuning: " + "; ".join(bad)


PRIVATE_IMPORTS_ALLOWED = {
    # Preloading only, no API use: the driver imports what DDP's constructor imports in every
    # worker (``torch._dynamo``, ~900 modules) once before forking them. No public module
    # imports it (torch.compiler and torch.nn.parallel import it lazily, inside functions);
    # torch.compiler.list_backends() would, but loads ~400 backend modules more.
    ("torchjob.launch._start", "torch._dynamo"),
}


def test_no_private_module_of_a_dependency_is_imported() -> None:
    own = tuple(ROOTS)
    bad = sorted(
        f"{name} imports {i}"
        for name, path in _all_modules().items()
        for i, _ in set(every_import(path))
        if not any(_within(i, top) for top in own)
        and any(part.startswith("_") and not part.startswith("__") for part in i.split("."))
        and (name, i) not in PRIVATE_IMPORTS_ALLOWED
    )
    assert not bad, "private modules of dependencies: " + "; ".join(bad)
