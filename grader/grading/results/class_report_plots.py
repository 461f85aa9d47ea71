"""The class report's plots, as inline SVG (nothing fetched): a histogram of the share of points the students
earned, and every student's speed ratio as a dot on a log axis beside the thresholds for credit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from grader.checks.text import escape as _e

BINS = 10


def histogram_svg(fractions: Sequence[float], *, title: str, ident: str) -> str:
    """Counts of students per tenth of the points (the last bin holds full marks)."""
    counts = [0] * BINS
    for f in fractions:
        counts[min(BINS - 1, max(0, int(f * BINS + 1e-9)))] += 1
    width, height, left, bottom, top = 320, 176, 30, 30, 34
    bar_w = (width - left - 10) / BINS
    peak = max(counts) or 1
    svg = [f'<svg class="histogram" id="hist-{_e(ident)}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">',
           f'<text x="{width / 2}" y="14" text-anchor="middle" font-size="12">{_e(title)}</text>']
    for i, count in enumerate(counts):
        h = (height - top - bottom) * count / peak
        x = left + i * bar_w
        svg.append(f'<rect class="bar" data-count="{count}" x="{x + 1:.1f}" y="{height - bottom - h:.1f}" '
                   f'width="{bar_w - 2:.1f}" height="{h:.1f}" fill="#1f77b4"><title>{i * 10}–{(i + 1) * 10}%: '
                   f"{count}</title></rect>")
        if count:
            svg.append(f'<text x="{x + bar_w / 2:.1f}" y="{height - bottom - h - 3:.1f}" text-anchor="middle" '
                       f'font-size="10">{count}</text>')
    for pct, anchor in ((0, "middle"), (50, "middle"), (100, "end")):  # "100%" ends at the axis: never clipped
        x = left + (width - left - 10) * pct / 100
        svg.append(f'<text x="{x:.1f}" y="{height - bottom + 14}" text-anchor="{anchor}" font-size="10">{pct}%</text>')
    svg.append(f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" stroke="#888"/>')
    svg.append("</svg>")
    return "".join(svg)


def strip_svg(ratios: Sequence[float], *, title: str, full: float | None, partial: float | None) -> str:
    """Every student's ratio as a dot on a log axis, with the thresholds for partial and full credit."""
    marks = [v for v in (*ratios, full or 0, partial or 0) if v and v > 0]
    lo, hi = math.log10(min(marks)) - 0.15, math.log10(max(marks)) + 0.15
    width, height, left, right = 420, 90, 20, 20

    def sx(v: float) -> float:
        return left + (math.log10(v) - lo) / (hi - lo) * (width - left - right)

    svg = [f'<svg class="strip" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="speed ratios {_e(title)}">',
           f'<text x="{width / 2}" y="13" text-anchor="middle" font-size="12">{_e(title)}</text>',
           f'<line x1="{left}" y1="50" x2="{width - right}" y2="50" stroke="#888"/>']
    for value, name, color in ((partial, "partial", "#f0a000"), (full, "full", "#176f2c")):
        if value:
            svg.append(f'<line x1="{sx(value):.1f}" y1="32" x2="{sx(value):.1f}" y2="66" stroke="{color}" '
                       f'stroke-dasharray="3,2"/><text x="{sx(value):.1f}" y="28" text-anchor="middle" '
                       f'font-size="9" fill="{color}">{name} {value:.2g}×</text>')
    for i, value in enumerate(sorted(ratios)):
        svg.append(f'<circle class="dot" cx="{sx(value):.1f}" cy="{44 + (i % 3) * 6}" r="3.5" fill="#1f77b4" '
                   f'fill-opacity="0.7"><title>{value:.3g}×</title></circle>')
    for k in range(math.ceil(lo * 2), math.floor(hi * 2) + 1):
        v = 10 ** (k / 2)
        svg.append(f'<text x="{sx(v):.1f}" y="86" text-anchor="middle" font-size="9">{v:.2g}×</text>')
    svg.append("</svg>")
    return "".join(svg)
