"""How fast is fast enough is the instructor's call: the course file's ``[speed_curve]`` sets full and partial
speed credit per exercise or part, against the speed baseline or as a fraction of the reference's ratio; the
grader scores with it and says so, ``grader list`` shows it, and a malformed curve is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader import cli
from grader.grading import config
from grader.grading.exercise_run import item_plan
from grader.grading.exercise_run.judging import ExerciseJudge
from grader.grading.isolation import protocol
from grader.speed import credit
from grader.speed.thresholds import speed_curves
from grader.speed.thresholds.calibrated import Threshold
from grader.speed.thresholds.speed_curves import Curve

from ..test_speed_trust import GELU, PART, _measurement, _thresholds


def _course(tmp_path, text: str) -> config.Course:
    path = tmp_path / "course.toml"
    path.write_text(text)
    return config.load_course(path)


def _judged(measurement, monkeypatch, limits, curves):
    monkeypatch.setattr(credit, "load_thresholds", lambda gpu=None: limits)
    item = next(it for it in item_plan.plan(GELU, device="cuda", secret="s", random_cases=0, speed_budget_s=1.0)
                if it.role == "speed")
    judge = ExerciseJudge(GELU, device="cuda", student_dir="/nowhere", curves=curves)
    judge.on_reply(item, protocol.RunSpeed(item.id, PART.name, 1.0, None), protocol.SpeedDone(item.id, measurement))
    return judge.parts[PART.name].speed


def test_a_baseline_curve_gives_full_credit_at_half_the_baselines_speed(tmp_path, monkeypatch):
    course = _course(tmp_path, '[speed_curve]\ngelu = { of = "baseline", full = 0.5, partial = 0.2 }\n')
    half = _measurement(0.1874, 0.0937)  # the student at half the baseline's speed
    assert _judged(half, monkeypatch, _thresholds(), {}).fraction == 0.0  # the calibrated rule: 0.9 for full
    curved = _judged(half, monkeypatch, _thresholds(), course.speed_curves)
    assert curved.fraction == pytest.approx(1.0) and curved.status == "measured"
    assert "speed curve (the course file's): full credit from 0.5× torch's speed" in curved.message
    between = _judged(_measurement(0.0937 / 0.35, 0.0937), monkeypatch, _thresholds(), course.speed_curves)
    assert between.fraction == pytest.approx(0.5)


def test_a_reference_curve_scales_the_calibrated_ratio(tmp_path):
    course = _course(tmp_path, '[speed_curve]\n"gelu.forward" = { full = 0.5, partial = 0.25 }\n')
    curve = course.curve("gelu", "forward")
    assert curve == Curve("reference", 0.5, 0.25) and course.curve("softmax", "forward") is None
    threshold = Threshold("torch", 0.1, 0.2, 1.8, 1.0, reference_ratio=2.0)
    assert curve.apply(threshold).full == pytest.approx(1.0) and curve.apply(threshold).partial == pytest.approx(0.5)
    assert curve.apply(Threshold("torch", 0.1, 0.2, 1.8, 1.0)) == Threshold("torch", 0.1, 0.2, 1.8, 1.0)
    part_first = _course(tmp_path, '[speed_curve]\ngelu = { of = "baseline", full = 0.9 }\n'
                                   '"gelu.forward" = { of = "baseline", full = 0.3 }\n')
    assert speed_curves.curve_for(part_first.speed_curves, "gelu", "forward").full == 0.3


@pytest.mark.parametrize(("text", "error"), [
    ('[speed_curve]\nnope = { full = 0.5 }\n', "nope: not a speed-graded exercise or part"),
    ('[speed_curve]\n"rmsnorm.backward" = { full = 0.5 }\n', "rmsnorm.backward: not a speed-graded"),
    ('[speed_curve]\ngelu = { of = "torch", full = 0.5 }\n', "of must be one of baseline, reference"),
    ('[speed_curve]\ngelu = { full = 0.5, partial = 0.6 }\n', "need 0 <= partial < full"),
    ('[speed_curve]\ngelu = { fast = 1 }\n', "gelu must be"),
])
def test_a_malformed_curve_is_refused_by_name(tmp_path, text, error):
    with pytest.raises(config.CourseError, match=error):
        _course(tmp_path, text)


def test_grader_list_states_the_curve_and_a_changed_curve_is_a_changed_course(tmp_path, capsys):
    path = tmp_path / "course.toml"
    path.write_text('[speed_curve]\nflash_attention = { of = "baseline", full = 0.6, partial = 0.2 }\n')
    assert cli.main(["list", "--course", str(path)]) == 0
    out = capsys.readouterr().out
    assert "speed curve: full credit from 0.6× sdpa-flash's speed, none at or below 0.2×" in out
    assert out.count("speed curve: full credit from 0.6×") == 2  # flash_attention's forward and autograd
    assert out.count("speed curve: the default*") == 4  # the other speed-graded parts
    assert "* full speed credit from 0.92 of the reference solution's speed on the grading GPU" in out
    assert "the default of `grader grade` on a GPU), else (`--no-yardstick`)" in out
    assert config.load_course(path).fingerprint() != config.load_course().fingerprint()


def test_pytest_speed_tests_take_the_course_files_curve(pytester: pytest.Pytester):
    """``pytest --grader-course COURSE.toml`` grades speed with the course's curve (said in the header), and a
    malformed curve is a usage error naming the key, before any test runs."""
    repo = Path(__file__).resolve().parents[3]
    good = pytester.path / "course.toml"
    good.write_text('[speed_curve]\nflash_attention = { of = "baseline", full = 0.6, partial = 0.2 }\n')
    result = pytester.runpytest_subprocess(str(repo / "assignments" / "gelu"), "--co", "-p", "no:cacheprovider",
                                           "--grader-course", str(good))
    result.stdout.fnmatch_lines(["grader: speed curve of the course file for flash_attention: full credit from 0.6×*"])
    bad = pytester.path / "bad.toml"
    bad.write_text('[speed_curve]\n"gelu.backward" = { full = 0.5 }\n')
    result = pytester.runpytest_subprocess(str(repo / "assignments" / "gelu"), "--co", "-p", "no:cacheprovider",
                                           "--grader-course", str(bad))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--grader-course:" in result.stderr.str()
    assert "[speed_curve] gelu.backward: not a speed-graded exercise or part" in result.stderr.str()


def test_grader_list_into_a_pipe_closed_early_ends_quietly():
    """``grader list | head -1``: the reader has gone away; the command ends without a traceback."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: every write fails with a broken pipe
    try:
        code = "import sys; from grader import cli; sys.exit(cli.main(['list']))"
        lister = subprocess.run([sys.executable, "-c", code], stdout=write_end, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    finally:
        os.close(write_end)
    assert lister.returncode == 0 and "Traceback" not in lister.stderr, lister.stderr
