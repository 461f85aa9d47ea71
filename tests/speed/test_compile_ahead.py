"""The speed warm-up compiles the candidates of a student's ``@triton.autotune`` choice all at once, on threads
(grader.speed.autotune, ``COMPILE`` mode), on the CPU: a fake kernel stands in for Triton's ``JITFunction`` (compiling
for a GPU needs one), submitting its compilations to Triton's own asynchronous compilation as ``JITFunction`` does.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from pathlib import Path

import pytest

from grader.checks import gpu_gate
from grader.speed import student_calls

CANDIDATES = 4


class _Descriptor:
    """Stands in for a tensor descriptor: its block shape, set by a config's pre_hook, is part of the signature."""

    block = 0


class _FakeKernel:
    """Binds its arguments when called (the signature: BLOCK and the descriptor's block shape, as Triton's binder
    reads them), compiles on Triton's asynchronous compilation when it is active and asked to warm up, else at once;
    a launch runs the compiled kernel. ``fail`` is a BLOCK whose compilation fails as Triton's does when a config
    needs too much shared memory."""

    def __init__(self, gate: _ReleasedGate, fail: int | None = None):
        self.fn = lambda desc, n, BLOCK: None  # the autotuner walks .fn to the Python function
        self.arg_names = ["desc", "n", "BLOCK"]
        self.gate = gate
        self.fail = fail
        self.barrier = threading.Barrier(CANDIDATES, timeout=10)  # passes only if every candidate compiles at once
        self.compiled: dict[tuple, str] = {}  # signature -> how it was compiled ("ahead" or "at launch")
        self.launched: list[tuple] = []
        self.waited_released: list[bool] = []

    def _compile(self, key: tuple) -> str:
        if key[0] == self.fail:
            from triton.runtime.errors import OutOfResources

            raise OutOfResources(300_000, 232_448, "shared memory")
        return "compiled"

    def _compile_ahead(self, key: tuple) -> str:
        self.barrier.wait()
        return self._compile(key)

    def run(self, *args, grid, warmup, **kwargs):
        from triton.runtime import _async_compile

        desc, block = args[0], kwargs["BLOCK"]
        key = (block, desc.block)
        if key not in self.compiled:
            mode = _async_compile.active_mode.get()
            if warmup and mode is not None:
                def finalize(kernel):  # in the worker's thread, when it has waited for the compiler
                    self.compiled[key] = "ahead"
                    self.waited_released.append(self.gate.released_now)

                extra = (lambda future_kernel: None,) if len(inspect.signature(mode.submit).parameters) == 4 else ()
                return mode.submit(key, lambda: self._compile_ahead(key), finalize, *extra)
            self._compile(key)
            self.compiled[key] = "at launch"
        if not warmup:
            self.launched.append(key)


class _ReleasedGate(gpu_gate.NoGate):
    """Says whether a thread is inside ``released()``."""

    def __init__(self):
        self.released_now = False

    @contextlib.contextmanager
    def released(self):
        self.released_now = True
        try:
            yield
        finally:
            self.released_now = False


def _tuner(monkeypatch, fail: int | None = None):
    from triton.runtime.autotuner import Autotuner, Config

    from grader.speed import autotune

    gate = _ReleasedGate()
    monkeypatch.setattr(gpu_gate, "_current", gate)
    autotune.install(default=autotune.FIRST)
    kernel = _FakeKernel(gate, fail)

    def pre_hook(nargs):  # the descriptor's block shape follows the config being launched
        nargs["desc"].block = nargs["BLOCK"] * 2

    configs = [Config({"BLOCK": 16 << i}, pre_hook=pre_hook) for i in range(CANDIDATES + 1)]
    tuner = Autotuner(kernel, kernel.arg_names, configs, key=["n"], reset_to_zero=None, restore_value=None,
                      prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: configs[:CANDIDATES]})
    return tuner, kernel


@pytest.mark.parametrize("fail", [None, 32])
def test_the_candidates_of_a_choice_compile_at_once_in_the_speed_warm_up(monkeypatch, fail):
    """Every candidate the student's pruning keeps is compiled ahead, all at once (the fake's barrier passes only
    then), each with the arguments its own pre_hook set; then each runs once from its compiled kernel. The worker
    waits for the compiler outside its GPU work. A candidate that fails to compile is compiled again when the
    autotuner runs it, which meets the error and skips it."""
    from grader.speed import autotune

    tuner, kernel = _tuner(monkeypatch, fail)
    with autotune.mode(autotune.COMPILE):
        tuner.run(_Descriptor(), 100, grid=(1,), warmup=False)

    wanted = [(16 << i, 32 << i) for i in range(CANDIDATES)]  # the fifth config was pruned
    working = [key for key in wanted if key[0] != fail]
    assert {key: kernel.compiled[key] for key in working} == dict.fromkeys(working, "ahead")
    assert sorted(kernel.compiled) == working  # the failing one left no kernel behind
    assert kernel.waited_released == [True] * len(working)
    assert kernel.launched[:len(working)] == working  # each candidate once, then the choice
    assert not kernel.barrier.broken


def test_correctness_calls_compile_only_the_first_candidate_that_runs(monkeypatch):
    """``FIRST`` mode (correctness checks) compiles nothing ahead: only the first candidate, at its launch."""
    from grader.speed import autotune

    tuner, kernel = _tuner(monkeypatch)
    with autotune.mode(autotune.FIRST):
        tuner.run(_Descriptor(), 100, grid=(1,), warmup=False)
    assert kernel.compiled == {(16, 32): "at launch"}
    assert kernel.launched == [(16, 32), (16, 32)]  # the candidate found, then the call with the choice


@pytest.mark.gpu
def test_on_a_gpu_the_speed_warm_up_finds_every_candidate_of_every_benchmark_compiled(tmp_path, monkeypatch):
    """As a speed worker does it before its warm-up (where the GPUs have room): the reference FlashAttention's
    autograd benchmarks, compiled ahead through a copy of the module with the autotuner in ``COMPILE`` mode: every
    candidate of every choice (forward, dK/dV and dQ kernels, four candidates each) compiles at once. The warm-up's
    calls on the module itself then compile nothing more (no new cubin in the Triton cache)."""
    import torch

    from grader import exercises
    from grader.checks import compile_ahead, loader, specialization, tensors
    from grader.speed import autotune

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: Triton compiles only there (the interpreter has nothing to compile)")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    assert specialization.install() and autotune.install(default=autotune.FIRST)
    fa = exercises.get("flash_attention")
    part = fa.part("autograd")
    solutions = Path(__file__).resolve().parents[2] / "solutions"
    module = loader.load(solutions, fa, part.functions)
    ahead = loader.load(solutions, fa, part.functions, copy="_compile_ahead")
    with tensors.generated_on("meta"):
        signatures = [part.make_inputs(bench.case) for bench in part.benchmarks]
    with autotune.mode(autotune.COMPILE):
        kernels, error = compile_ahead.compile_calls(part, ahead, signatures, "cuda", generic=False)
        autotune.forget_untimed()

        def cubins() -> int:
            return len(list((tmp_path / "triton-cache").rglob("*.cubin")))

        before = cubins()
        # Three head-dim and causal classes (the two 64-dim causal benchmarks share their kernels), three kernels
        # with four candidates each.
        assert error is None and kernels >= 3 * 3 * 4, kernels
        assert before == kernels
        assert student_calls.warm_part(part, module) is None
    assert cubins() == before
