"""Test functions generated from an exercise spec. ``assignments/<name>/test_<name>.py`` is two lines:

    from grader.pytest_tests import exercise_tests
    globals().update(exercise_tests("<name>"))

For every part: ``test_<part>_examples`` (the spec's fixed edge cases, one test each),
``test_<part>_random`` (hypothesis; shrinks a failure to a minimal case), ``test_<part>_integrity``
and, where the API must reject bad arguments, ``test_<part>_bad_input``. The checks themselves live
in :mod:`grader.check`, shared with the grader.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, reject

from grader import check, exercises
from grader.pytest_speed import speed_tests
from grader.spec import Exercise, Part


def exercise_tests(name: str) -> dict[str, Callable]:
    exercise = exercises.get(name)
    tests: dict[str, Callable] = {}
    for part in exercise.parts:
        prefix = f"test_{part.name}"
        tests[f"{prefix}_examples"] = _examples_test(exercise, part)
        tests[f"{prefix}_random"] = _random_test(exercise, part)
        tests[f"{prefix}_integrity"] = _integrity_test(exercise, part)
        if part.bad_inputs:
            tests[f"{prefix}_bad_input"] = _bad_input_test(exercise, part)
    tests.update(speed_tests(exercise))
    return tests


def _test_file(request) -> Path:
    return Path(str(request.node.path))


def _fail(verdict: check.Verdict) -> None:
    if not verdict.passed:
        pytest.fail(verdict.message, pytrace=False)


def _examples_test(exercise: Exercise, part: Part):
    @pytest.mark.parametrize("case", part.examples, ids=[c.label for c in part.examples])
    def test(grader_session, request, case):
        __tracebackhide__ = True
        module = grader_session.ready(exercise, part, _test_file(request))
        reason = part.skip(case, grader_session.device)
        if reason:
            pytest.skip(reason)
        _fail(check.run_case(exercise, part, module, case, grader_session.device))

    test.__doc__ = f"{exercise.title} ({part.name}): fixed edge cases from grader/exercises/{exercise.name}.py"
    return test


def _random_test(exercise: Exercise, part: Part):
    def test(grader_session, request):
        __tracebackhide__ = True
        module = grader_session.ready(exercise, part, _test_file(request))
        device = grader_session.device

        @given(case=part.cases(device))
        def random_case(case):
            __tracebackhide__ = True
            if part.skip(case, device):
                reject()
            verdict = check.run_case(exercise, part, module, case, device)
            if not verdict.passed:
                raise AssertionError(verdict.message)

        random_case()

    test.__doc__ = f"{exercise.title} ({part.name}): hypothesis-generated cases, shrunk on failure"
    return test


def _integrity_test(exercise: Exercise, part: Part):
    def test(grader_session, request):
        module = grader_session.ready(exercise, part, _test_file(request))
        student_dir = str(Path(module.__file__).parent)
        for case in part.integrity_cases or part.examples[:1]:
            if part.skip(case, grader_session.device):
                continue
            ex = check.execute(part, module, case, grader_session.device)
            _fail(check.judge_integrity(part, case, ex, student_dir=student_dir))

    test.__doc__ = f"{exercise.title} ({part.name}): own Triton kernel, no PyTorch compute, inputs untouched"
    return test


def _bad_input_test(exercise: Exercise, part: Part):
    @pytest.mark.parametrize("bad", part.bad_inputs, ids=[b.label for b in part.bad_inputs])
    def test(grader_session, request, bad):
        module = grader_session.ready(exercise, part, _test_file(request))
        _fail(check.check_bad_input(module, bad, grader_session.device))

    test.__doc__ = f"{exercise.title} ({part.name}): bad arguments raise a clear error"
    return test
