"""Scoring (grader.grading.results.scoring): correctness as a fraction of the checks or all or nothing, an integrity
flag zeroes its part, speed counts only where it was measured (on a CPU the maximum shrinks and the reports say why;
on a GPU an unmeasured part scores zero), and an exercise not submitted scores zero with the reason."""

from __future__ import annotations

import pytest

from grader import exercises
from grader.grading import config
from grader.grading.exercise_run import runner
from grader.grading.results import reports, scoring, terminal
from grader.grading.results.results import CheckResult, ExerciseResult, PartResult, SpeedResult

GELU = exercises.get("gelu")


def _result(status="graded", passed=(True, True, True, True), flags=(), integrity_ok=True, speed=None):
    part = PartResult("forward", status)
    part.checks = [CheckResult(f"c{i}", "example", f"case {i}", "passed" if ok else "failed",
                               "" if ok else f"wrong on case {i}", size=10 * (i + 1)) for i, ok in enumerate(passed)]
    part.checks.append(CheckResult("i0", "integrity", "case", "passed" if integrity_ok else "failed",
                                   "" if integrity_ok else "raised"))
    part.flags = [dict(f) for f in flags]
    part.speed = speed or SpeedResult("not measured", "not measured: no GPU")
    return ExerciseResult("gelu", "Fused GeLU", "graded", parts=[part])


def _course(**changes) -> config.Course:
    course = config.load_course()
    values = {"name": course.name, "total": course.total, "weights": course.weights, "correctness": course.correctness,
              "grading": course.grading, "source": course.source}
    return config.Course(**{**values, **changes})


def test_correctness_is_a_fraction_or_all_or_nothing(tmp_path):
    result = _result(passed=(True, True, True, False))
    fraction = scoring.score_exercise(GELU, result, _course(total=100.0), (GELU,))
    (line, *_) = fraction.lines
    assert line.score == pytest.approx(0.75 * line.max_score) and not line.passed
    assert "3 of 4 checks passed" in line.output and "wrong on case 3" in line.output
    strict = scoring.score_exercise(GELU, result, _course(total=100.0, correctness="all-or-nothing"), (GELU,))
    assert strict.lines[0].score == 0


def test_smallest_failing_case_is_reported_first():
    result = _result(passed=(True, False, True, False))
    assert result.parts[0].first_failure().label == "case 1"


def test_an_integrity_flag_zeroes_the_whole_part():
    speed = SpeedResult("measured", "fast", 1.0)
    flagged = _result(flags=[{"rule": "no-torch-compute", "message": "gelu called aten.gelu"}], speed=speed)
    score = scoring.score_exercise(GELU, flagged, _course(total=100.0), (GELU,))
    assert score.score == 0
    assert any("[no-torch-compute] gelu called aten.gelu" in line.output for line in score.lines)
    clean = scoring.score_exercise(GELU, _result(speed=speed), _course(total=100.0), (GELU,))
    assert clean.score == pytest.approx(clean.max_score) and clean.score == pytest.approx(100.0)


def test_speed_is_worth_nothing_where_it_was_not_measured():
    part = GELU.parts[0]
    score = scoring.score_exercise(GELU, _result(), _course(total=100.0), (GELU,))
    assert [ln.component for ln in score.lines] == ["correctness"]  # no 0/0 lines
    if part.speed_points:
        assert score.max_score == pytest.approx(100.0 * part.points / GELU.max_points)
    half = _result(speed=SpeedResult("measured", "half", 0.5))
    scored = scoring.score_exercise(GELU, half, _course(total=100.0), (GELU,))
    if part.speed_points:
        speed_line = scored.lines[-1]
        assert speed_line.component == "speed" and speed_line.score == pytest.approx(speed_line.max_score / 2)


def test_reports_say_which_points_a_cpu_cannot_award_and_why(tmp_path):
    result = _result()
    result.device = {"kind": "cpu"}
    score = scoring.score_exercise(GELU, result, _course(total=100.0), (GELU,))
    speed_points = 100.0 * GELU.parts[0].speed_points / GELU.max_points
    assert score.unavailable_points == pytest.approx(speed_points) and score.max_score == pytest.approx(
        100.0 - speed_points)
    report = reports.StudentReport("ann", "/subs/ann", "directory", [], "CPU via the Triton interpreter",
                                   [(score, result)], 12.0)
    note = (f"The maximum here is {100 - speed_points:.2f} points, not 100: the other {speed_points:.2f} are speed "
            "points, not available in this run — speed is measured on a GPU only (here the kernels ran in the "
            "Triton interpreter).")
    assert note in reports.markdown(report)
    assert "| gelu / forward: speed | – / 33.33 (not counted) | not available:" in reports.markdown(report)
    assert 'id="speed-unavailable"' in reports.render_html(report)
    assert note in reports.gradescope(report)["output"]
    header, row = reports.gradebook_csv([report], ["gelu"]).splitlines()[:2]
    assert header.endswith(",speed_unavailable") and row.endswith(",33.33")
    assert "12.0 s of grading (its exercises' times added up)" in reports.markdown(report)
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(terminal.summary_table([report], ["gelu"]))
    text = " ".join(console.export_text().split())  # the caption wraps at the table's width
    assert "time (sum)" in text and "the batch's wall time follows the table" in text
    assert "33.33 speed points are not — speed is measured on a GPU only" in text


def test_on_a_gpu_an_unmeasured_part_scores_zero_speed_instead_of_shrinking_the_maximum():
    result = _result(speed=SpeedResult("not measured", "not measured: not implemented"))
    result.device = {"kind": "cuda"}
    score = scoring.score_exercise(GELU, result, _course(total=100.0), (GELU,))
    speed = score.lines[-1]
    assert speed.component == "speed" and speed.score == 0 and speed.max_score > 0 and not speed.passed
    assert "not implemented" in speed.output and score.unavailable == []
    assert score.max_score == pytest.approx(100.0)


def test_one_check_is_one_check():
    result = _result(passed=(False,))
    line = scoring.score_exercise(GELU, result, _course(total=100.0), (GELU,)).lines[0]
    assert "0 of 1 check passed" in line.output


def test_not_submitted_scores_zero_with_the_reason(tmp_path):
    settings = _settings(tmp_path)
    result = runner.grade_exercise(GELU, tmp_path / "empty", settings=settings, scratch=tmp_path / "scratch")
    assert result.status == "not submitted" and "not submitted: no gelu/gelu.py" in result.message
    score = scoring.score_exercise(GELU, result, _course(), (GELU,))
    assert score.score == 0 and score.max_score > 0


def _settings(tmp_path, **changes) -> config.RunSettings:
    return config.resolve(config.GradeOptions(random_cases=0, timeout_s=5, **changes), config.load_course(),
                          device="cpu", secret="s", workdir=tmp_path)
