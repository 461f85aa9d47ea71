"""Test functions generated from an exercise spec. ``assignments/<name>/test_<name>.py`` is two lines:

    from grader.pytest_plugin import exercise_tests
    globals().update(exercise_tests("<name>"))

One test function per kind of check the spec declares (:mod:`grader.checks.catalog`), named
``test_<part>_<kind>`` and parametrized by the check's label where a kind has several: the fixed
examples, the random cases (hypothesis; it shrinks a failure to a minimal case), the integrity rules,
the bad inputs, each extra check (e.g. ``test_forward_memory``) and the speed benchmarks. The checks
themselves are :mod:`grader.checks` — the same code the grader runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, reject

from grader import exercises
from grader.checks import catalog, verdicts
from grader.checks.spec import Exercise, ExtraCheck, Part
from grader.pytest_plugin.speed_tests import speed_test


def exercise_tests(name: str) -> dict[str, Callable]:
    exercise = exercises.get(name)
    tests: dict[str, Callable] = {}
    for part in exercise.parts:
        extras = {x.name: x for x in part.extra_checks}
        for kind in catalog.kinds(part):
            if kind == "examples":
                test = _examples_test(exercise, part)
            elif kind == "random":
                test = _random_test(exercise, part)
            elif kind == "integrity":
                test = _integrity_test(exercise, part)
            elif kind == "bad_input":
                test = _bad_input_test(exercise, part)
            elif kind == catalog.SPEED:
                test = speed_test(exercise, part)
            else:
                test = _extra_test(exercise, part, extras[kind])
            tests[f"test_{part.name}_{kind}"] = pytest.mark.grader_check(f"{part.name}.{kind}")(test)
    return tests


def _test_file(request) -> Path:
    return Path(str(request.node.path))


def _fail(verdict: verdicts.Verdict) -> None:
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
        verdict = verdicts.run_case(part, module, case, grader_session.device)
        if not verdict.passed and (hint := grader_session.examples_hint(part, module)):
            verdict.message += f"\n  hint, from all the examples of {part.name}: {hint}"
        _fail(verdict)

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
            verdict = verdicts.run_case(part, module, case, device)
            if not verdict.passed:
                raise AssertionError(verdict.message)

        random_case()

    test.__doc__ = f"{exercise.title} ({part.name}): hypothesis-generated cases, shrunk on failure"
    return test


def _integrity_test(exercise: Exercise, part: Part):
    def test(grader_session, request):
        module = grader_session.ready(exercise, part, _test_file(request))
        student_dir = str(Path(module.__file__).parent)
        for case in part.integrity_examples:
            if part.skip(case, grader_session.device):
                continue
            _fail(verdicts.run_integrity(part, module, case, grader_session.device, student_dir=student_dir))

    test.__doc__ = f"{exercise.title} ({part.name}): own Triton kernel, no PyTorch compute, inputs untouched"
    return test


def _bad_input_test(exercise: Exercise, part: Part):
    @pytest.mark.parametrize("bad", part.bad_inputs, ids=[b.label for b in part.bad_inputs])
    def test(grader_session, request, bad):
        module = grader_session.ready(exercise, part, _test_file(request))
        _fail(verdicts.run_bad_input(module, bad, grader_session.device))

    test.__doc__ = f"{exercise.title} ({part.name}): bad arguments raise a clear error"
    return test


def _extra_test(exercise: Exercise, part: Part, extra: ExtraCheck):
    def test(grader_session, request):
        module = grader_session.ready(exercise, part, _test_file(request))
        device = grader_session.device
        _fail(extra.judge(extra.execute(module, device), device))

    test.__doc__ = f"{exercise.title} ({part.name}): {extra.description}"
    return test

