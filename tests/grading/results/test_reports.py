"""A student's reports (grader.grading.results.reports): the Markdown report, the Gradescope results.json and the
gradebook row; the HTML report with the roofline chart of its speed, the student's text escaped, as headless Chromium
renders it."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from grader import exercises
from grader.grading.results import reports, scoring
from grader.grading.results.results import ExerciseResult, PartResult, SpeedResult
from grader.speed import roofline
from grader.speed.credit import BenchmarkCredit

from ...speed.test_roofline import ROWS
from .test_scoring import _course, _result

ALL = exercises.all_exercises()
GELU = exercises.get("gelu")


def _report(tmp_path) -> reports.StudentReport:
    speed = SpeedResult("measured", "speed: 80% <b>not html</b>", 0.8,
                        [BenchmarkCredit(**{"baseline": "torch", **row}) for row in ROWS],
                        roofline={"copy_gbps": 3000.0, "matmul_tflops": {"float16": 700.0}})
    result = _result(passed=(True, False), flags=[{"rule": "fresh-inputs", "message": "replayed <script>"}],
                     speed=speed)
    missing = ExerciseResult("softmax", "Fused softmax", "not submitted", "not submitted: no softmax/softmax.py",
                             parts=[PartResult("forward", "not submitted", "not submitted: no softmax/softmax.py")])
    course = _course(total=20.0)
    pairs = [(scoring.score_exercise(e, r, course, ALL[:2]), r) for e, r in ((GELU, result), (ALL[1], missing))]
    return reports.StudentReport("zoe", "/subs/zoe.zip", "zip", ["a problem"], "CUDA on a test GPU", pairs, 12.0)


def test_markdown_gradescope_and_csv(tmp_path):
    report = _report(tmp_path)
    reports.write_student(tmp_path, report)
    md = (tmp_path / "students" / "zoe" / "report.md").read_text()
    assert "# Grade report: zoe" in md and "not submitted: no softmax/softmax.py" in md
    assert "Integrity flag `fresh-inputs`" in md and "| 4096x4096 fp16 |" in md
    data = json.loads((tmp_path / "students" / "zoe" / "results.json").read_text())
    assert data["score"] == pytest.approx(report.score) and data["tests"]
    assert {t["status"] for t in data["tests"]} <= {"passed", "failed"}
    gradebook = reports.gradebook_csv([report], ["gelu", "softmax"])
    header, row = gradebook.splitlines()[:2]
    assert header.startswith("student,total,max_total,gelu,softmax,gelu_status,softmax_status")
    assert row.startswith("zoe,0,") and "not submitted" in row


def test_the_html_report_draws_the_same_roofline(tmp_path):
    page = reports.render_html(_report(tmp_path))
    assert roofline.roofline_svg(ROWS, title="gelu / forward", peak_gbps=3000.0, peak_tflops=700.0) in page


def test_html_escapes_student_controlled_text(tmp_path):
    page = reports.render_html(_report(tmp_path))
    assert "<script>" not in page and "replayed &lt;script&gt;" in page
    assert "<b>not html</b>" not in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_html_report_renders_in_headless_chromium(tmp_path):
    report = _report(tmp_path)
    reports.write_student(tmp_path, report)
    page = tmp_path / "students" / "zoe" / "report.html"
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*command, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert '<h1 id="student">Grade report: zoe</h1>' in html
    assert "Total: <b>" in html and "gelu / forward: correctness" in html
    assert "not submitted: no softmax/softmax.py" in html
    assert 'class="roofline"' in html and html.count('class="point"') == 2
    assert "Integrity flag" in html and "4096x4096 fp16" in html
    shot = tmp_path / "report.png"
    subprocess.run([*command, f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
