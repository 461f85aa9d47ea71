"""A student's report says why points were lost: every correctness check by kind (fixed examples, random cases,
bad inputs), passed or failed with its one-line reason, and the hint that the failing checks point to — in the
Markdown and HTML reports (the HTML as headless Chromium renders it, where Chromium is installed) and in the
Gradescope results.json."""

from __future__ import annotations

import json
import shutil

from grader.grading import config
from grader.grading.commands import grade as grade_cmd

from ... import known_wrong
from ...sandboxing import sandbox_options
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


def test_a_checks_reason_is_its_mismatch_line_and_the_common_hint_counts_failing_checks():
    from grader.grading.results.results import FAILED, PASSED, CheckResult, PartResult

    message = ("gelu is wrong on\ncase Case(shape=(7,), dtype='float32')\n  x: shape (7,), float32\n"
               "y: 3 of 7 elements differ (atol=1e-05)\n  hint: the errors are small: a slightly wrong formula\n")
    wrong = CheckResult("forward.random[0]", "random", "shape=7", FAILED, message)
    assert wrong.reason == "y: 3 of 7 elements differ (atol=1e-05)"
    assert wrong.hints() == ["the errors are small: a slightly wrong formula"]
    raised = CheckResult("forward.examples[x]", "example", "x", FAILED, "gelu raised ValueError: no\n  frame")
    assert raised.reason == "gelu raised ValueError: no"
    part = PartResult("forward", "graded", checks=[wrong, raised, CheckResult("b", "bad_input", "b", PASSED)])
    assert part.common_hint() == ("the errors are small: a slightly wrong formula", 1, 2)
    # one failing check of four gives it: too few to be the part's hint
    others = [CheckResult(f"forward.random[{i}]", "random", "s", FAILED, "gelu raised ValueError: no") for i in (1, 2)]
    assert PartResult("forward", "graded", checks=[wrong, raised, *others]).common_hint() is None
    assert [(kind, len(checks)) for kind, checks in part.checks_by_kind()] == [
        ("fixed examples", 1), ("random cases", 1), ("bad inputs", 1)]
