"""Every test leaves Triton's autotuner and kernel launches as it found them (tests/conftest.py): a patch left
behind by one test changes how every later test in the process runs kernels."""

from __future__ import annotations

from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

TESTS = """
from triton.runtime.autotuner import Autotuner, Config

from grader.checks import specialization
from grader.speed import autotune

found = {}


class _Kernel:
    \"\"\"Stands in for a JITFunction: its launches do nothing.\"\"\"

    fn = staticmethod(lambda n, BLOCK: None)
    arg_names = ["n", "BLOCK"]

    def run(self, *args, grid, warmup, **kwargs):
        pass


def test_patches_triton_and_autotunes_untimed():
    found.update(tuner=autotune.installed(), specializing=specialization.installed())
    assert autotune.install(default=autotune.FIRST) and specialization.install()
    kernel = _Kernel()
    tuner = Autotuner(kernel, kernel.arg_names, [Config({"BLOCK": 16}), Config({"BLOCK": 32})], key=["n"],
                      reset_to_zero=None, restore_value=None)
    tuner.run(100, grid=(1,), warmup=False)
    assert tuner.cache  # the first config, chosen without timing
    found["autotuner"] = tuner


def test_finds_triton_as_the_first_test_found_it():
    assert (autotune.installed(), specialization.installed()) == (found["tuner"], found["specializing"])
    assert not found["autotuner"].cache  # the next call times its candidates
"""


def test_a_test_that_patches_triton_leaves_it_as_it_found_it(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_patches=TESTS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_without_the_restoring_fixture_the_patch_outlives_its_test(pytester):
    """The known-bad case: the same two tests without tests/conftest.py's fixture."""
    pytester.makepyfile(test_patches=TESTS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1, failed=1)
