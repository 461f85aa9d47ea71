"""The modes a worker's request sets for the student's code — how ``@triton.autotune`` chooses
(grader.speed.autotune) and whether correctness calls compile generic kernels (grader.checks.specialization) —
hold in every thread the request runs: PyTorch's autograd engine runs a CUDA backward pass on a thread of its own,
so a student's autotuned backward kernels are tuned by the speed measurement and compiled generically by the
correctness cases like the forward ones. The GPU test runs a real backward pass; the CPU tests a plain thread."""

from __future__ import annotations

import threading

import pytest

from grader.checks import specialization
from grader.speed import autotune


def _in_a_thread(read):
    seen: list = []
    thread = threading.Thread(target=lambda: seen.append(read()))
    thread.start()
    thread.join(timeout=10)
    return seen[0]


def test_the_autotune_mode_of_a_request_holds_in_the_threads_it_starts():
    with autotune.mode(autotune.TUNE):
        assert _in_a_thread(autotune._mode) == autotune.TUNE
        with autotune.mode(autotune.COMPILE):
            assert _in_a_thread(autotune._mode) == autotune.COMPILE
        assert _in_a_thread(autotune._mode) == autotune.TUNE
    with autotune.one_turn():
        assert _in_a_thread(autotune._mode) == autotune.TUNE
    assert _in_a_thread(autotune._mode) == autotune._default  # back to the default after the block


def test_generic_compilation_of_a_correctness_call_holds_in_the_threads_it_starts():
    def generic_now() -> bool:
        return getattr(specialization._state, "generic", False)

    assert not _in_a_thread(generic_now)
    with specialization.generic():
        assert _in_a_thread(generic_now)
    assert not _in_a_thread(generic_now)


@pytest.mark.gpu
def test_a_backward_pass_on_the_gpu_runs_in_the_mode_of_the_call_that_started_it():
    import torch

    seen: list = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append((threading.current_thread() is threading.main_thread(), autotune._mode(),
                         getattr(specialization._state, "generic", False)))
            return grad * 2

    x = torch.ones(4, device="cuda", requires_grad=True)
    with autotune.mode(autotune.TUNE), specialization.generic():
        Probe.apply(x).sum().backward()
    on_main, mode, generic = seen[0]
    assert not on_main  # the autograd engine's thread: what made thread-local modes miss it
    assert (mode, generic) == (autotune.TUNE, True)
