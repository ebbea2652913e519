"""Line charts as SVG, written by hand (no plotting dependency), shared by the benchmarks:
bench/goodput.py's timelines (``goodput_accounting.timeline_svg``) and bench/recovery_scale.py's
recovery-time curve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape


@dataclass(frozen=True)
class Series:
    """One line of a chart."""

    name: str
    points: Sequence[tuple[float, float]]
    color: str = "steelblue"
    dashed: bool = False
    markers: bool = False


def chart(
    title: str,
    series: Sequence[Series],
    *,
    vlines: Sequence[float] = (),
    hline: tuple[float, str] | None = None,
    log_x: bool = False,
    x_ticks: Sequence[float] | None = None,
    x_unit: str = "",
    y_unit: str = "",
    width: int = 640,
    height: int = 240,
) -> str:
    """An SVG line chart: one polyline per series (a legend when there are several), a red
    dashed vertical line at each of ``vlines`` (in x units), a grey dashed horizontal line
    at ``hline`` (its value and label: a target). ``log_x`` draws x on a log scale (x > 0);
    ``x_ticks`` labels those x values (else the ends of the axis)."""
    xs = [p[0] for s in series for p in s.points] + list(vlines)
    ys = [p[1] for s in series for p in s.points] + ([hline[0]] if hline else [])
    frame = _Frame.fit(xs, ys, log_x=log_x, width=width, height=height)
    parts = [
        *_axes(frame, title, x_ticks=x_ticks, x_unit=x_unit, y_unit=y_unit),
        *_marks(frame, vlines, hline),
        *_lines(frame, series),
        "</svg>\n",
    ]
    return "".join(parts)


@dataclass(frozen=True)
class _Frame:
    """A chart's size and scales: where an (x, y) value lands in the SVG."""

    lo: float
    """The x axis's ends (their logs when ``log_x``)."""
    hi: float
    y_max: float
    log_x: bool
    width: int
    height: int
    pad: int = 40

    @classmethod
    def fit(
        cls, xs: Sequence[float], ys: Sequence[float], *, log_x: bool, width: int, height: int
    ) -> _Frame:
        """The frame that holds every x in ``xs`` and every y in ``ys`` (y from 0)."""
        if log_x:
            if any(x <= 0 for x in xs):
                raise ValueError("log_x needs x > 0")
            lo, hi = math.log(min(xs, default=1.0)), math.log(max(xs, default=10.0))
            if hi <= lo:
                hi = lo + 1.0
        else:
            lo, hi = 0.0, max([*xs, 1.0])
        y_max = max([*ys, 1.0]) * 1.1
        return cls(lo, hi, y_max, log_x, width, height)

    def x(self, v: float) -> float:
        u = math.log(v) if self.log_x else v
        return self.pad + (self.width - 2 * self.pad) * (u - self.lo) / (self.hi - self.lo)

    def y(self, v: float) -> float:
        return self.height - self.pad - (self.height - 2 * self.pad) * v / self.y_max


def _axes(
    f: _Frame, title: str, *, x_ticks: Sequence[float] | None, x_unit: str, y_unit: str
) -> list[str]:
    """The SVG's start: background, title, both axes, the y maximum and the x labels."""
    pad, width, height = f.pad, f.width, f.height
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{pad}" y="20" font-size="13">{escape(title)}</text>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="black"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
        f'<text x="4" y="{pad}" font-size="11">{f.y_max:.1f}{escape(y_unit)}</text>',
    ]
    if x_ticks is None:
        ticks = [(float(pad), f"{math.exp(f.lo) if f.log_x else f.lo:g}", "start")]
        ticks.append((float(width - pad), f"{math.exp(f.hi) if f.log_x else f.hi:.0f}", "end"))
    else:
        ticks = [(f.x(t), f"{t:g}", "middle") for t in x_ticks]
    for tx, label, anchor in ticks:
        parts.append(
            f'<text x="{tx:.1f}" y="{height - 10}" font-size="11" text-anchor="{anchor}">'
            f"{escape(label + x_unit)}</text>"
        )
    return parts


def _marks(f: _Frame, vlines: Sequence[float], hline: tuple[float, str] | None) -> list[str]:
    """The red dashed vertical lines and the grey dashed target line with its label."""
    pad, width, height = f.pad, f.width, f.height
    parts = [
        f'<line x1="{f.x(v):.1f}" y1="{pad}" x2="{f.x(v):.1f}" y2="{height - pad}" '
        'stroke="red" stroke-dasharray="4 3"/>'
        for v in vlines
    ]
    if hline is not None:
        value, label = hline
        parts.append(
            f'<line x1="{pad}" y1="{f.y(value):.1f}" x2="{width - pad}" y2="{f.y(value):.1f}" '
            'stroke="grey" stroke-dasharray="6 4"/>'
            f'<text x="{width - pad}" y="{f.y(value) - 4:.1f}" font-size="11" '
            f'text-anchor="end" fill="grey">{escape(label)}</text>'
        )
    return parts


def _lines(f: _Frame, series: Sequence[Series]) -> list[str]:
    """One polyline per series (with its markers), and a legend when there are several."""
    parts = []
    for i, s in enumerate(series):
        line = " ".join(f"{f.x(px):.1f},{f.y(py):.1f}" for px, py in s.points)
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{s.color}" stroke-width="1.5"{dash}/>'
        )
        if s.markers:
            parts.extend(
                f'<circle cx="{f.x(px):.1f}" cy="{f.y(py):.1f}" r="3" fill="{s.color}"/>'
                for px, py in s.points
            )
        if len(series) > 1:
            ly = f.pad + 14 * i
            parts.append(
                f'<text x="{f.pad + 8}" y="{ly + 4}" font-size="11" fill="{s.color}">'
                f"{escape(s.name)}</text>"
            )
    return parts
