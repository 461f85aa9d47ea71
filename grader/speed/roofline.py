"""The roofline chart, drawn as self-contained SVG: the grade report's HTML inlines it, ``grader bench --plot``
writes it to a file (alone, or in an HTML page).

Input rows are the speed rows the reports and ``grader bench`` already hold: ``label``, ``gbps``, ``tflops`` and
``pct_roofline`` (and ``series``, the implementation, where several are drawn together). Rows with both rates
are drawn on a log-log roofline (FLOP/byte against TFLOP/s) with the roof when the GPU's peaks are known; pure
bandwidth kernels (no FLOP count) become bars of their percentage of the roofline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from grader.checks.text import escape as _e
from grader.checks.text import positive_number as _num

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")




def peaks(roofline: dict[str, Any]) -> tuple[float | None, float | None]:
    """The roof of a measured roofline (``{"copy_gbps", "matmul_tflops": {dtype: rate}}``): copy bandwidth in
    GB/s and the highest matmul rate in TFLOP/s, None where unknown."""
    rates = [r for r in ((roofline.get("matmul_tflops") or {}).values()) if _num(r)]
    return _num(roofline.get("copy_gbps")), max(rates) if rates else None


def _colors(rows: list[dict]) -> dict[str, str]:
    series = list(dict.fromkeys(str(r.get("series", "")) for r in rows))
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series)}


def _legend(colors: dict[str, str], x: float, y: float) -> list[str]:
    if len(colors) < 2:
        return []
    out = []
    for i, (name, color) in enumerate(colors.items()):
        out.append(f'<circle cx="{x:.1f}" cy="{y + 14 * i:.1f}" r="4" fill="{color}"/>'
                   f'<text x="{x + 8:.1f}" y="{y + 14 * i + 4:.1f}" font-size="10">{_e(name)}</text>')
    return out


def roofline_svg(rows: list[dict], *, title: str = "", peak_gbps: float | None = None,
                 peak_tflops: float | None = None) -> str:
    """A log-log roofline plot (FLOP/byte vs TFLOP/s) of the benchmarks, drawn as inline SVG.

    Each benchmark is a filled dot at its achieved throughput and a ring at what the roofline allows
    at its intensity (achieved ÷ % of roofline). With the GPU's peaks the roof itself is drawn. Rows
    without FLOP counts (pure bandwidth kernels) are shown as bars of % of roofline instead. Rows with a
    ``series`` get one colour per series and a legend. Empty string when no row has a number to draw.
    """
    colors = _colors(rows)
    points = []
    for row in rows:
        gbps, tflops = _num(row.get("gbps")), _num(row.get("tflops"))
        if gbps and tflops:
            pct = _num(row.get("pct_roofline"))
            attainable = tflops / (pct / 100) if pct else None
            points.append((str(row.get("label", "")), 1e3 * tflops / gbps, tflops, attainable,
                           colors[str(row.get("series", ""))]))
    if not points:
        return _pct_bars(rows, title, colors)
    width, height, left, bottom, top, right = 560, 340, 64, 44, 28, 16
    xs = [p[1] for p in points]
    ys = [v for p in points for v in (p[2], p[3]) if v]
    if peak_tflops:
        ys.append(peak_tflops)
    x0, x1 = math.floor(math.log10(min(xs))) - 0.5, math.ceil(math.log10(max(xs))) + 0.5
    y0, y1 = math.floor(math.log10(min(ys))) - 0.3, math.ceil(math.log10(max(ys))) + 0.3

    def sx(x: float) -> float:
        return left + (math.log10(x) - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return height - bottom - (math.log10(y) - y0) / (y1 - y0) * (height - bottom - top)

    svg = [f'<svg class="roofline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="roofline plot {_e(title)}">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">Roofline: {_e(title)}</text>']
    for k in range(math.ceil(x0), math.floor(x1) + 1):
        x = sx(10.0**k)
        svg.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{height - bottom + 14}" text-anchor="middle" font-size="10">1e{k}</text>')
    for k in range(math.ceil(y0), math.floor(y1) + 1):
        y = sy(10.0**k)
        svg.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{y + 3:.1f}" text-anchor="end" font-size="10">1e{k}</text>')
    svg.append(f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
               'fill="none" stroke="#888"/>')
    svg.append(f'<text x="{(left + width - right) / 2}" y="{height - 8}" text-anchor="middle" font-size="11">'
               "arithmetic intensity (FLOP/byte)</text>")
    svg.append(f'<text x="14" y="{(top + height - bottom) / 2}" text-anchor="middle" font-size="11" '
               f'transform="rotate(-90 14 {(top + height - bottom) / 2})">TFLOP/s</text>')
    if peak_gbps and peak_tflops:
        ridge = 1e3 * peak_tflops / peak_gbps
        xa, xb = 10.0**x0, 10.0**x1
        roof = [(xa, min(peak_tflops, peak_gbps * xa / 1e3)), (max(min(ridge, xb), xa), peak_tflops),
                (xb, peak_tflops)]
        pts = " ".join(f"{sx(x):.1f},{sy(max(y, 10.0**y0)):.1f}" for x, y in roof)
        svg.append(f'<polyline points="{pts}" fill="none" stroke="#444" stroke-width="2"/>')
    for label, x, achieved, attainable, color in points:
        if attainable:
            svg.append(f'<line x1="{sx(x):.1f}" y1="{sy(achieved):.1f}" x2="{sx(x):.1f}" y2="{sy(attainable):.1f}" '
                       'stroke="#99b" stroke-dasharray="3,3"/>'
                       f'<circle cx="{sx(x):.1f}" cy="{sy(attainable):.1f}" r="5" fill="none" stroke="#336"/>')
        svg.append(f'<circle class="point" cx="{sx(x):.1f}" cy="{sy(achieved):.1f}" r="4.5" fill="{color}">'
                   f"<title>{_e(label)}: {achieved:.3g} TFLOP/s at {x:.3g} FLOP/byte</title></circle>"
                   f'<text x="{sx(x) + 7:.1f}" y="{sy(achieved) - 6:.1f}" font-size="10">{_e(label)}</text>')
    svg += _legend(colors, left + 10, top + 12)
    svg.append("</svg>")
    return "".join(svg)


def _pct_bars(rows: list[dict], title: str, colors: dict[str, str]) -> str:
    bars = [(str(r.get("label", "")), _num(r.get("pct_roofline")), colors[str(r.get("series", ""))]) for r in rows]
    bars = [(label, pct, color) for label, pct, color in bars if pct]
    if not bars:
        return ""
    width, row_h, left = 560, 22, 200
    height = 34 + row_h * len(bars)
    svg = [f'<svg class="roofline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="percent of roofline {_e(title)}">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">% of roofline: {_e(title)}</text>']
    for i, (label, pct, color) in enumerate(bars):
        y = 26 + i * row_h
        w = (width - left - 60) * min(pct, 100.0) / 100.0
        svg.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end" font-size="11">{_e(label)}</text>'
                   f'<rect x="{left}" y="{y}" width="{width - left - 60}" height="{row_h - 6}" fill="#eee"/>'
                   f'<rect class="point" x="{left}" y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="{color}"/>'
                   f'<text x="{left + w + 4:.1f}" y="{y + 13}" font-size="11">{pct:.0f}%</text>')
    svg.append("</svg>")
    return "".join(svg)


def stack(svgs: list[str]) -> str:
    """Several charts one below the other, as one SVG document."""
    svgs = [s for s in svgs if s]
    sizes = [(_attr(s, "width"), _attr(s, "height")) for s in svgs]
    width = max((w for w, _ in sizes), default=0)
    out, y = [], 0.0
    for svg, (_, h) in zip(svgs, sizes):
        out.append(svg.replace("<svg ", f'<svg x="0" y="{y:g}" ', 1))
        y += h + 10
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{max(0.0, y - 10):g}" '
            f'viewBox="0 0 {width:g} {max(0.0, y - 10):g}">' + "".join(out) + "</svg>")


def _attr(svg: str, name: str) -> float:
    head = svg[: svg.index(">")]
    start = head.index(f' {name}="') + len(name) + 3
    return float(head[start: head.index('"', start)])


def html_page(title: str, svgs: Sequence[str], notes: Sequence[str] = ()) -> str:
    """A self-contained HTML page with the charts (and a line of text each for ``notes``)."""
    body = "".join(f"<p>{_e(n)}</p>" for n in notes) + "".join(f"<div>{s}</div>" for s in svgs if s)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            "<style>body{font-family:system-ui,sans-serif;margin:2rem}svg text{font-family:inherit}</style>"
            f"</head><body><h1>{_e(title)}</h1>{body}</body></html>\n")
