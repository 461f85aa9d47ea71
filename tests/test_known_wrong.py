"""Every known-wrong fixture fails the check it declares, with a message naming what is wrong, and
passes the checks it declares it passes (it fails on the right test)."""

from __future__ import annotations

import importlib
import re
from functools import cache

import pytest

from grader import cases, check, exercises, loader
from grader.runtime import configure

from .known_wrong import KnownWrong, discover

FIXTURES = discover()
N_RANDOM = 12  # random cases on top of the examples


def _verdicts(fixture: KnownWrong, part_name: str, what: str) -> list[check.Verdict]:
    exercise = exercises.get(fixture.exercise)
    part = exercise.part(part_name)
    device = configure().device
    try:
        module = loader.load(fixture.root, exercise, part.functions)
    except loader.LoadError as exc:  # the load itself is the check that fires
        return [check.Verdict(False, str(exc))]
    student_dir = str(loader.module_path(fixture.root, exercise).parent)
    if what == "correctness":
        return [
            check.run_case(exercise, part, module, case, device)
            for case in cases.all_cases(part, device, N_RANDOM, seed=0)
        ]
    if what == "integrity":
        integrity_cases = [c for c in (part.integrity_cases or part.examples[:1]) if not part.skip(c, device)]
        return [
            check.judge_integrity(part, c, check.execute(part, module, c, device), student_dir=student_dir)
            for c in integrity_cases
        ]
    if what == "bad_input":
        return [check.check_bad_input(module, bad, device) for bad in part.bad_inputs]
    extra = getattr(importlib.import_module(f"grader.exercises.{fixture.exercise}"), f"check_{what}", None)
    if callable(extra):  # an exercise's own check, e.g. flash_attention's check_memory(module, device)
        return [extra(module, device)]
    raise ValueError(f"{fixture.id}: unknown check {what!r}")


_cached_verdicts = cache(_verdicts)


def test_every_exercise_has_fixtures():
    names = {f.exercise for f in FIXTURES}
    assert {e.name for e in exercises.all_exercises()} <= names


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.id for f in FIXTURES])
def test_known_wrong_fails_where_it_should(fixture: KnownWrong):
    assert fixture.expectations, f"{fixture.id} declares no 'expect:' line"
    assert any(e.kind == "expect" for e in fixture.expectations)
    for e in fixture.expectations:
        verdicts = _cached_verdicts(fixture, e.part, e.check)
        failures = [v.message for v in verdicts if not v.passed]
        if e.kind == "expect":
            assert failures, f"{fixture.id}: {e.part}.{e.check} passed, but the fixture is wrong ({fixture.summary})"
            assert any(re.search(e.pattern, m, re.IGNORECASE | re.DOTALL) for m in failures), (
                f"{fixture.id}: {e.part}.{e.check} failed, but no message matches {e.pattern!r}:\n\n"
                + "\n---\n".join(failures[:3])
            )
        else:
            assert verdicts, f"{fixture.id}: {e.part}.{e.check} ran no case"
            assert not failures, f"{fixture.id}: {e.part}.{e.check} should pass:\n" + "\n---\n".join(failures[:3])
