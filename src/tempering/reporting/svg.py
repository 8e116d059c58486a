"""Standalone SVG pictures of held-out accuracy (0-100% up) against some x across: the frame,
ticks, lines and legend that ``temper report``'s accuracy-against-length pictures and the
benches' accuracy-against-time charts share, written as plain text so they need no plotting
library and read the same in a browser, a README or a paper.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    """One line of a chart: its points ``(x, accuracy)`` in data units."""

    points: Sequence[tuple[float, float]]
    colour: str
    title: str
    """Shown when the pointer rests on the line."""
    width: float = 2.0
    opacity: float = 1.0
    dots: bool = False
    """A dot at each point."""


def accuracy_chart(title: str, *, across: Callable[[float], float], ticks: Sequence[tuple[float, str]], x_label: str,
                   lines: Sequence[Line], legend: Sequence[tuple[str, str]], notes: Sequence[str] = (),
                   rules: Sequence[float] = (), width: int = 560, height: int = 320, right: int = 110) -> str:
    """An SVG chart: ``across`` maps an x value to its place across the plot (0 the left edge, 1
    the right), ``ticks`` are x values and their labels under it, ``legend`` pairs of label and
    colour at the right, ``notes`` lines of text under the legend, ``rules`` accuracies drawn
    as dashed lines across. Text is escaped.

    >>> svg = accuracy_chart("a <b>", across=lambda v: v / 10, ticks=[(0, "0"), (10, "10")], x_label="steps",
    ...                      lines=[Line([(0, 0.0), (10, 1.0)], "#000", "run")], legend=[("run", "#000")])
    >>> svg.startswith("<svg"), "a &lt;b&gt;" in svg, svg.count("<polyline"), 'points="56.0,276.0 450.0,30.0"' in svg
    (True, True, 1, True)
    """
    left, top, bottom = 56, 30, 44
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(value: float) -> float:
        return left + plot_w * across(value)

    def y(accuracy: float) -> float:
        return top + plot_h * (1 - accuracy)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11">', f'<text x="{left}" y="18" font-size="13">{escaped(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
    for tick in range(6):
        parts.append(f'<text x="{left - 6}" y="{y(tick / 5) + 4:.1f}" text-anchor="end">{tick / 5:.0%}</text>')
    for value, label in ticks:
        parts.append(f'<text x="{x(value):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{escaped(label)}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">{escaped(x_label)}</text>')
    for accuracy in rules:
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(accuracy):.1f}" y2="{y(accuracy):.1f}" '
                     'stroke="#bbb" stroke-dasharray="4 3"/>')
    for line in lines:
        points = " ".join(f"{x(v):.1f},{y(a):.1f}" for v, a in line.points)
        opacity = f' opacity="{line.opacity:g}"' if line.opacity < 1 else ""
        parts.append(f'<polyline points="{points}" fill="none" stroke="{line.colour}" stroke-width="{line.width:g}"'
                     f'{opacity}><title>{escaped(line.title)}</title></polyline>')
        if line.dots:
            parts += [f'<circle cx="{x(v):.1f}" cy="{y(a):.1f}" r="3" fill="{line.colour}"/>' for v, a in line.points]
    for index, (label, colour) in enumerate(legend):
        row = top + 12 + 18 * index
        parts.append(f'<line x1="{width - right + 12}" x2="{width - right + 36}" y1="{row}" y2="{row}" '
                     f'stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{width - right + 42}" y="{row + 4}">{escaped(label)}</text>')
    for index, note in enumerate(notes):
        parts.append(f'<text x="{width - right + 12}" y="{top + 18 * len(legend) + 24 + 14 * index}">'
                     f'{escaped(note)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def escaped(text: str) -> str:
    """``text`` safe inside an SVG element.

    >>> escaped("a<b & c>")
    'a&lt;b &amp; c&gt;'
    """
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
