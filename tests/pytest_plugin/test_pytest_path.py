"""The student and staff pytest experience, end to end (pytest run in a subprocess, as a user would)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from grader import exercises

from .. import known_wrong

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENTS = ROOT / "assignments"


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider", "--hypothesis-profile", "ci", "-q",
                                         timeout=900)


@pytest.mark.slow
def test_reference_solutions_pass_every_exercise(pytester: pytest.Pytester):
    """Staff verification: `pytest assignments/ --impl solutions` passes (CPU: in the Triton interpreter)."""
    result = _run(pytester, str(ASSIGNMENTS), "--impl", str(ROOT / "solutions"), "-m", "not speed", "-rs")
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()[-5000:]
    assert outcomes.get("passed", 0) >= 10 * len(exercises.all_exercises())
    assert "failed" not in outcomes


def test_untouched_stubs_give_one_clear_failure_per_part_group(pytester: pytest.Pytester):
    result = _run(pytester, str(ASSIGNMENTS), "-m", "not speed", "-rs")
    out = result.stdout.str()
    expected = {
        (e.name, p.missing_key) for e in exercises.all_exercises() for p in e.parts
    }
    assert result.parseoutcomes().get("failed") == len(expected), out[-4000:]
    for exercise in exercises.all_exercises():
        assert f"is not implemented yet — see assignments/{exercise.name}/README.md" in out
    assert "Traceback" not in out and "NotImplementedError" not in out  # short, no pages of tracebacks
    assert "(reported above)" in out  # the rest are skipped, saying why


def test_header_says_which_mode_is_active(pytester: pytest.Pytester):
    result = _run(pytester, str(ASSIGNMENTS / "gelu"), "--impl", str(ROOT / "solutions"), "--co", "-v")  # -v: header
    out = result.stdout.str()
    assert re.search(r"grader: (CPU via the Triton interpreter|CUDA on )", out), out
    assert "hypothesis profile ci" in out


def _fixture_tree(fixture_id: str, dest: Path) -> Path:
    fixture = next(f for f in known_wrong.discover() if f.id == fixture_id)
    return known_wrong.materialize(fixture, dest / fixture.name)


def test_numeric_failure_report_is_shrunk_and_explains(pytester: pytest.Pytester):
    """A wrong kernel (erf instead of tanh) through pytest: hypothesis shrinks it, the message explains it."""
    impl = _fixture_tree("gelu/erf", pytester.path)
    result = _run(pytester, str(ASSIGNMENTS / "gelu"), "--impl", str(impl), "-k", "random")
    out = result.stdout.str()
    assert result.ret == 1
    assert "Falsifying example" in out or "Failing test case" in out  # hypothesis' wording varies by version
    for needle in ("case=Case(", "max abs error", "first mismatches", "strides"):
        assert needle in out, f"{needle!r} missing from:\n{out[-3000:]}"
    assert re.search(r"y: \d+ of \d+ elements? differs?", out), out[-3000:]


def test_unwritten_elements_are_named(pytester: pytest.Pytester):
    impl = _fixture_tree("gelu/floor_grid", pytester.path)
    result = _run(pytester, str(ASSIGNMENTS / "gelu"), "--impl", str(impl), "-k", "examples")
    assert "1 element was never written" in result.stdout.str()


def test_a_failing_example_says_what_all_the_examples_suggest(pytester: pytest.Pytester):
    impl = _fixture_tree("gelu/ignores_strides", pytester.path)
    result = _run(pytester, str(ASSIGNMENTS / "gelu"), "--impl", str(impl), "-k", "examples")
    out = result.stdout.str()
    assert result.parseoutcomes().get("failed") == 2, out[-3000:]
    # Count in the failure reports only: how much of each message the short summary repeats depends on the
    # terminal width, which differs between a console and CI.
    failures = out.split("short test summary info")[0]
    hint = "hint, from all the examples of forward: all 2 failing cases have a non-contiguous input"
    assert failures.count(hint) == 2


def test_missing_impl_directory_is_a_usage_error(pytester: pytest.Pytester):
    result = _run(pytester, str(ASSIGNMENTS / "gelu"), "--impl", "no/such/dir")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--impl no/such/dir: no such directory" in result.stderr.str()


def test_syntax_error_in_a_submission_is_reported_once(pytester: pytest.Pytester):
    tree = pytester.path / "impl" / "gelu"
    tree.mkdir(parents=True)
    (tree / "gelu.py").write_text("def gelu(x):\n    return x +\n")
    result = _run(pytester, str(ASSIGNMENTS / "gelu"), "--impl", str(tree.parent))
    out = result.stdout.str()
    assert result.parseoutcomes().get("failed") == 1, out
    assert "gelu.py has a syntax error at line 2" in out


def test_an_autotuned_kernel_runs_in_the_students_tests(pytester: pytest.Pytester):
    """@triton.autotune asks a GPU driver for its benchmarker, which the interpreter has none of: on a CPU the student's
    tests run its first runnable config (as the grader's workers do), on a GPU they autotune as usual."""
    impl = pytester.path / "impl"
    shutil.copytree(ROOT / "tests" / "corpus" / "softmax_autotuned", impl)
    result = _run(pytester, str(ASSIGNMENTS / "softmax"), "--impl", str(impl), "-m", "not speed")
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert "active drivers" not in result.stdout.str()


def test_tests_without_the_plugin_say_how_to_load_it(pytester: pytest.Pytester):
    """grader importable (from the course folder) but its plugin not loaded: one error naming the fix per test file,
    not a 'fixture not found' error on every test."""
    result = _run(pytester, str(ASSIGNMENTS / "gelu"), "-p", "no:grader")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, out[-3000:]  # a collection error stops the run
    assert result.parseoutcomes().get("errors") == 1, out[-3000:]
    assert "the course's pytest plugin is not loaded" in out and "pip install -e ." in out
    assert "fixture 'grader_session' not found" not in out
