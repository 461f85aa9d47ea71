"""The students' face of the grader: the pytest plugin (``plugin.py``, registered through the ``pytest11``
entry point), the tests it generates from each exercise spec, and the hypothesis profiles."""

from __future__ import annotations

import sys
from collections.abc import Callable

PLUGIN = f"{__name__}.plugin"  # the module the pytest11 entry point names
NOT_LOADED = (
    "the course's pytest plugin is not loaded, so these tests have no grader_session: the Python running pytest "
    "({python}) imports grader from this folder, but the project is not installed there (or `-p no:grader` turned "
    "its plugin off). Run pytest from the course's environment (`bash scripts/bootstrap.sh`, then "
    "`. .venv/bin/activate`), or install the project into this Python (`pip install -e .`), or name the plugin: "
    "`pytest -p {plugin} ...`."
)


def exercise_tests(name: str) -> dict[str, Callable]:
    """The test functions of exercise ``name`` (see :mod:`grader.pytest_plugin.spec_tests`).

    Imported on call, not with the package: the plugin must pick the device (and set TRITON_INTERPRET)
    before anything imports triton. Without the plugin (the project not installed in the Python running pytest,
    or ``-p no:grader``) every test would error on a missing fixture; one collection error says why instead."""
    if PLUGIN not in sys.modules:
        import pytest

        pytest.fail(NOT_LOADED.format(python=sys.executable, plugin=PLUGIN), pytrace=False)
    from grader.pytest_plugin.spec_tests import exercise_tests as build

    return build(name)
