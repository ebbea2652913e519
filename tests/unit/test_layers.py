"""The import layers of docs/architecture.md, enforced: the table there is the contract.

Every module under runtime/ and operator/ is parsed (not imported); its module-level
imports (``TYPE_CHECKING`` blocks and function bodies excluded: those are lazy) must not
name anything in the "never imports" column of its layer's row.
"""

from __future__ import annotations

import ast
import re
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
    assert any("torchjob.plan" in mods for mods, _ in rows)


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
