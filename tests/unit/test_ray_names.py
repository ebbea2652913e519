"""Every row of docs/runtime.md's Ray-name table names something importable in torchjob."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"


def _rows() -> list[tuple[str, str]]:
    text = DOC.read_text()
    table = text.split("<!-- ray-names:begin -->")[1].split("<!-- ray-names:end -->")[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[1].startswith("`torchjob"):
            continue
        rows.append((cells[0], cells[1].strip("`")))
    return rows


def _resolve(dotted: str) -> Any:
    """Import the longest module prefix of ``dotted``, then getattr the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_table_covers_every_seed() -> None:
    seeds = " ".join(ray for ray, _ in _rows())
    for seed in ("000", "001", "002", "003", "004"):
        assert seed in seeds
    assert len(_rows()) >= 40


@pytest.mark.parametrize(("ray_name", "torchjob_name"), _rows())
def test_row_imports(ray_name: str, torchjob_name: str) -> None:
    obj = _resolve(torchjob_name)
    assert obj is not None, f"{ray_name} -> {torchjob_name}"
