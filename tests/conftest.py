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
