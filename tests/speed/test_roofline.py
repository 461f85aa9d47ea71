"""The roofline chart (grader.speed.roofline): a point per benchmark under the roof of the GPU's peaks, bars where
only a share of the roofline is known, one colour per series with its legend, no chart without data; the peaks
read from a GPU's roofline record."""

from __future__ import annotations

from grader.speed import roofline

ROWS = [
    {"label": "4096x4096 fp16", "student_ms": 0.21, "baseline_ms": 0.35, "ratio": 1.67, "required_full": 1.5,
     "required_partial": 0.9, "gbps": 1280.0, "tflops": 0.9, "pct_roofline": 61.0},
    {"label": "1M fp32", "student_ms": 0.02, "baseline_ms": 0.03, "ratio": 1.5, "required_full": 1.5,
     "required_partial": 0.9, "gbps": 800.0, "tflops": 0.5, "pct_roofline": 40.0},
]


def test_roofline_svg_has_a_point_per_benchmark_and_the_roof():
    svg = roofline.roofline_svg(ROWS, title="t", peak_gbps=3000.0, peak_tflops=700.0)
    assert svg.startswith("<svg") and svg.count('class="point"') == 2 and "<polyline" in svg
    bars = roofline.roofline_svg([{"label": "copy", "gbps": 900.0, "pct_roofline": 30.0}], title="t")
    assert "% of roofline" in bars and bars.count('class="point"') == 1
    assert roofline.roofline_svg([{"label": "x"}], title="t") == ""
    series = roofline.roofline_svg([{**r, "series": s} for r, s in zip(ROWS, ("yours", "torch"))], title="t")
    assert series.count('r="4.5" fill="#1f77b4"') == 1 and series.count('r="4.5" fill="#ff7f0e"') == 1
    assert ">torch</text>" in series  # the legend
    assert roofline.peaks({"copy_gbps": 3000.0, "matmul_tflops": {"a": 600.0, "b": 700.0}}) == (3000.0, 700.0)
    assert roofline.peaks({}) == (None, None)
