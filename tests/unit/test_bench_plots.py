"""bench/plots.py: the SVG line chart the benchmarks share (goodput timelines, the recovery
curve of bench/recovery_scale.py)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from bench import plots

NS = "{http://www.w3.org/2000/svg}"


def _xs(polyline: ET.Element) -> list[float]:
    return [float(p.split(",")[0]) for p in (polyline.get("points") or "").split()]


def test_a_log_x_curve_spaces_world_sizes_by_their_ratio_and_draws_the_target() -> None:
    p50 = plots.Series("p50", [(2, 0.7), (8, 1.1), (32, 6.6), (64, 17.0)], markers=True)
    p95 = plots.Series("p95", [(2, 0.9), (8, 1.7), (32, 7.0), (64, 23.7)], dashed=True)
    svg = plots.chart("recovery", [p50, p95], hline=(3.0, "target"), log_x=True, x_ticks=[2, 8])
    root = ET.fromstring(svg)
    lines = root.findall(f"{NS}polyline")
    assert len(lines) == 2 and lines[1].get("stroke-dasharray")
    xs = _xs(lines[0])
    # 2 -> 8 and 8 -> 32 are the same ratio (4x): the same distance on a log axis.
    assert xs[1] - xs[0] == pytest.approx(xs[2] - xs[1], abs=0.2)
    assert len(root.findall(f"{NS}circle")) == 4
    assert any(e.get("stroke") == "grey" for e in root.findall(f"{NS}line"))
    assert {"p50", "p95", "target"} <= {t.text for t in root.findall(f"{NS}text")}


def test_log_x_refuses_a_non_positive_x() -> None:
    with pytest.raises(ValueError, match="x > 0"):
        plots.chart("t", [plots.Series("s", [(0, 1.0)])], log_x=True)
