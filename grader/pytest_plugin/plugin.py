"""pytest plugin (registered through the ``pytest11`` entry point): options, markers, header, the run's
state and the ``grader_session`` fixture. Hooks only; the logic lives in the modules it imports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grader.checks import runtime
from grader.pytest_plugin import profiles
from grader.pytest_plugin.session import GraderSession

# Importing the plugin decides the device; it must happen before any test module imports triton.
_mode_error: Exception | None = None
try:
    if runtime.configure().interpreter:
        from grader.speed import autotune

        # The interpreter has no GPU to time autotuning candidates on (Triton's autotuner asks for a driver and
        # fails): an @triton.autotune kernel runs its first runnable config, as the grader's workers do on a CPU.
        autotune.install(default=autotune.FIRST)
except runtime.RuntimeSetupError as exc:  # reported as a usage error in pytest_configure
    _mode_error = exc

SESSION_KEY = pytest.StashKey[GraderSession]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("grader", "Triton kernel exercises")
    group.addoption(
        "--grader-impl",
        "--impl",
        dest="grader_impl",
        default=None,
        metavar="PATH",
        help="test the implementations in PATH (laid out like assignments/, e.g. 'solutions') "
        "instead of the modules next to the tests",
    )
    group.addoption(
        "--grader-course",
        dest="grader_course",
        default=None,
        metavar="COURSE.toml",
        help="the speed tests use this course file's [speed_curve] (default: $GRADER_COURSE, else the GPU's "
        "calibrated thresholds)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if _mode_error is not None:
        raise pytest.UsageError(str(_mode_error))
    impl = config.getoption("grader_impl")
    root = None
    if impl:
        root = Path(impl)
        if not root.is_absolute():
            root = Path(config.invocation_params.dir) / root
        if not root.is_dir():
            raise pytest.UsageError(f"--impl {impl}: no such directory")
    course = config.getoption("grader_course") or os.environ.get("GRADER_COURSE")
    curves = {}
    if course:
        from grader.speed.thresholds import calibrated, speed_curves

        try:
            curves = speed_curves.course_curves(Path(config.invocation_params.dir) / course)
        except calibrated.ThresholdsError as exc:
            raise pytest.UsageError(f"--grader-course: {exc}") from None
    config.stash[SESSION_KEY] = GraderSession(runtime.configure(), root, curves=curves)
    config.addinivalue_line("markers", "speed: speed test; runs on CUDA only (skipped on CPU)")
    config.addinivalue_line("markers", "grader_check(check_id): the check of the exercise spec this test runs")
    # numpy's overflow warnings from interpreted kernels (exp of a large number, -inf - -inf) are
    # the IEEE behaviour the kernels rely on, not problems.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")
    if config.getoption("hypothesis_profile", None) is None:
        from hypothesis import settings

        settings.load_profile(profiles.DEFAULT)


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash[SESSION_KEY]
    from hypothesis import settings

    impl = str(session.impl_root) if session.impl_root else "the modules next to each test"
    lines = [
        f"grader: {session.mode.description}",
        f"grader: implementations from {impl}; hypothesis profile {settings._current_profile}",
    ]
    if note := runtime.version_note():
        lines.insert(1, f"grader: note: {note}")
    if session.mode.interpreter:
        lines.append("grader: no GPU — kernels run in the Triton interpreter; speed tests are skipped")
    else:
        from grader.speed import credit

        lines.append(f"grader: {credit.thresholds_summary()}")
    for key, curve in session.curves.items():
        lines.append(f"grader: speed curve of the course file for {key}: {curve.describe('its baseline')}")
    return lines


@pytest.fixture(scope="session")
def grader_session(pytestconfig: pytest.Config) -> GraderSession:
    return pytestconfig.stash[SESSION_KEY]
