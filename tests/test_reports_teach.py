"""A student's report says why points were lost: every correctness check by kind (fixed examples, random cases,
bad inputs), passed or failed with its one-line reason, and the hint that the failing checks point to — in the
Markdown and HTML reports (the HTML as headless Chromium renders it, where Chromium is installed) and in the
Gradescope results.json."""

from __future__ import annotations

import json
import shutil

from grader.grading import config
from grader.grading import grade as grade_cmd

from . import known_wrong
from .sandboxing import sandbox_options
from .test_class_report import _Cells, _chromium, _render


def test_the_report_of_a_wrong_kernel_lists_every_check_and_the_hint(tmp_path):
    fixture = next(f for f in known_wrong.discover() if f.id == "gelu/erf")
    shutil.copytree(known_wrong.tree_or_fail(fixture), tmp_path / "erf")
    out = tmp_path / "out"
    grade_cmd.grade([str(tmp_path / "erf")], out=out, options=config.GradeOptions(
        exercises=("gelu",), random_cases=5, secret="s", **sandbox_options()))
    folder = out / "students" / "erf"

    md = (folder / "report.md").read_text()
    assert "**forward: every check** — " in md and "- fixed examples, " in md and "- random cases, " in md
    assert "  - FAILED `shape=1021-dtype=float32-layout=contiguous-values=normal`: y: " in md
    assert "  - passed `" in md
    assert "**forward: hint** (from " in md and "slightly wrong formula or constant" in md

    gradescope = json.loads((folder / "results.json").read_text())
    output = next(t["output"] for t in gradescope["tests"] if "correctness" in t["name"])
    assert "every check:" in output and "FAILED shape=1021" in output
    assert "failing checks: the errors are small" in output

    html_path = folder / "report.html"
    html = _render(html_path, tmp_path / "profile") if _chromium() else html_path.read_text()
    cells = _Cells()
    cells.feed(html)
    listed = cells.by_id["checks-gelu-forward"]
    assert "fixed examples" in listed and "FAILED shape=1021-dtype=float32" in listed and "elements differ" in listed
