"""The exercise registry: every module in this package that defines ``EXERCISE`` is an exercise.

Adding an exercise means adding one spec module here (plus its stub, solution and handout); nothing
else lists exercises. ``EXERCISE.order`` is the position in the course. A module without ``EXERCISE`` is part of a
spec, named after it (``flash_attention_memory.py``).
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from grader.checks import catalog
from grader.checks.spec import Exercise


@cache
def all_exercises() -> tuple[Exercise, ...]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        exercise = getattr(module, "EXERCISE", None)
        if isinstance(exercise, Exercise):
            problems = catalog.validate(exercise)
            if problems:
                raise ValueError(f"grader/exercises/{info.name}.py: " + "; ".join(problems))
            found.append(exercise)
    return tuple(sorted(found, key=lambda e: (e.order, e.name)))


def get(name: str) -> Exercise:
    for exercise in all_exercises():
        if exercise.name == name:
            return exercise
    known = ", ".join(e.name for e in all_exercises())
    raise KeyError(f"unknown exercise {name!r} (known: {known})")
