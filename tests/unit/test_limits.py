"""The size limits hold themselves (issue 40): no source module in operator/, runtime/ or
bench/ is over 400 lines, and no function or method there is over 80 lines.

No file there is generated (the generated files, ``crds/`` and the chart's templates, are
YAML written by ``make crds``), so there is nothing to set aside.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("operator", "runtime", "bench")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py"))


def _long_functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function or method in ``path`` over the limit."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    length = child.end_lineno - child.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append((name, length))
                name += "."
            visit(child, name)

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return found


def test_sources_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert "runtime/torchjob/contract.py" in names
    assert "operator/torchjob_operator/handlers.py" in names
    assert "bench/harness.py" in names


def test_no_module_is_over_400_lines() -> None:
    offenders = []
    for path in _sources():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            offenders.append(f"  {path.relative_to(ROOT)}: {lines} lines")
    if offenders:
        pytest.fail(f"modules over the limit of {MAX_MODULE_LINES} lines:\n" + "\n".join(offenders))


def test_no_function_is_over_80_lines() -> None:
    offenders = [
        f"  {path.relative_to(ROOT)}: {name} ({lines} lines)"
        for path in _sources()
        for name, lines in _long_functions(path)
    ]
    if offenders:
        pytest.fail(
            f"functions over the limit of {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)
        )
