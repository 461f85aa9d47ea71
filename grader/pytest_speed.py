"""Speed tests (marker ``speed``), generated from each part's benchmarks. Placeholder until the
speed-grading issue lands: no speed tests yet."""

from __future__ import annotations

from collections.abc import Callable

from grader.spec import Exercise


def speed_tests(exercise: Exercise) -> dict[str, Callable]:
    return {}
