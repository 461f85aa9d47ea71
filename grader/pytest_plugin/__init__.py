"""The students' face of the grader: the pytest plugin (``plugin.py``, registered through the ``pytest11``
entry point), the tests it generates from each exercise spec, and the hypothesis profiles."""

from __future__ import annotations

from collections.abc import Callable


def exercise_tests(name: str) -> dict[str, Callable]:
    """The test functions of exercise ``name`` (see :mod:`grader.pytest_plugin.spec_tests`).

    Imported on call, not with the package: the plugin must pick the device (and set TRITON_INTERPRET)
    before anything imports triton."""
    from grader.pytest_plugin.spec_tests import exercise_tests as build

    return build(name)
