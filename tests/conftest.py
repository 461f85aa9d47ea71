"""Shared pytest set-up: the pytester fixture, and GPU-only tests (``@pytest.mark.gpu``) skipped with the reason
where kernels run in the Triton interpreter. ``pytest -m gpu`` runs exactly those on a GPU machine."""

from __future__ import annotations

import pytest

from grader.checks import runtime

pytest_plugins = ["pytester"]

GPU_REASON = ("needs a CUDA GPU: here kernels run in the Triton interpreter (run `pytest -m gpu` on a GPU "
              "machine)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if runtime.configure().is_cuda:
        return
    skip = pytest.mark.skip(reason=GPU_REASON)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _triton_patches_restored():
    """A test that patches Triton's autotuner or its kernel launches (``autotune.install``,
    ``specialization.install``) leaves them as it found them: a patch left behind changes how every later test in
    the process runs kernels (an autotuner left choosing its first config slows the references that later tests
    time), and no choice an autotuner made without timing: a kernel of a module the process keeps loaded (the
    references, loaded once per process) would run it where a later test times the kernel."""
    from grader.checks import specialization
    from grader.speed import autotune

    tuner, specializing = autotune.installed(), specialization.installed()
    yield
    autotune.forget_untimed()
    if autotune.installed() != tuner:
        autotune.uninstall()
        if tuner is not None:
            autotune.install(default=tuner)
    if specialization.installed() and not specializing:
        specialization.uninstall()
