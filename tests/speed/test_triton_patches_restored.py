"""Every test leaves Triton's autotuner and kernel launches as it found them (tests/conftest.py): a patch left
behind by one test changes how every later test in the process runs kernels."""

from __future__ import annotations

from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

TESTS = """
from grader.checks import specialization
from grader.speed import autotune

found = {}


def test_patches_triton():
    found.update(tuner=autotune.installed(), specializing=specialization.installed())
    assert autotune.install(default=autotune.TUNE) and specialization.install()


def test_finds_triton_as_the_first_test_found_it():
    assert (autotune.installed(), specialization.installed()) == (found["tuner"], found["specializing"])
"""


def test_a_test_that_patches_triton_leaves_it_as_it_found_it(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_patches=TESTS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_without_the_restoring_fixture_the_patch_outlives_its_test(pytester):
    """The known-bad case: the same two tests without tests/conftest.py's fixture."""
    pytester.makepyfile(test_patches=TESTS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1, failed=1)
