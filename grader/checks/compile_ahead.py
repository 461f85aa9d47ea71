"""A part's calls compile their kernels at once, on threads, before the calls run (the worker only, where the GPUs
have room for more runs than the batch has: one submission, a server): its correctness cases' and its benchmarks'.

A student's kernels compile once per dtype and constexpr values the cases meet (:mod:`.specialization`), and a
call that meets a new combination compiles it there, one kernel after another: for FlashAttention most of a
worker's time. Before its cases, the grader sends the worker their inputs without values (PyTorch's meta device:
shapes, dtypes and strides). The worker makes zero-filled tensors like them and calls the student's functions on
them with Triton's kernels compiled and not launched (:func:`specialization.compiling_only`, as ``warmup=True``
does) inside Triton's asynchronous compilation, so every kernel the calls reach compiles on a thread of its own
(Triton's compiler leaves Python's lock while it works); a backward pass runs on the calling thread, where that
compilation is active, not on the autograd engine's. The worker calls a copy of the student's module, with globals
of its own (:func:`grader.checks.loader.load`'s ``copy``): the cases find the kernels in the student's Triton cache
on disk, and nothing else the calls leave behind.

Nothing here is a check: an exception of the student's code is left for the cases to meet again, and a kernel the
calls only reach with real values compiles when its case runs, as before. The worker then forgets the choices a
student's ``@triton.autotune`` made meanwhile (``autotune.forget_untimed``): a candidate that was compiled and not
run cannot have failed, so the correctness calls choose again, by running them.

A worker that measures a part's speed does the same for the part's benchmarks before its speed warm-up, with
Triton's own specialization (as the speed measurement compiles) and the autotuner in ``COMPILE`` mode
(:mod:`grader.speed.autotune`): every candidate of every autotuning choice of every benchmark compiles at once,
rather than one choice's candidates at a time as the warm-up meets them, and the warm-up finds them compiled.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from types import ModuleType
from typing import Any

import torch

from grader.checks import gpu_gate, specialization
from grader.checks.spec import Inputs, Part

THREADS = 8  # compilations at once in one worker (its process's share of the host's cores is what bounds them)


def compile_calls(part: Part, module: ModuleType, signatures: list[Inputs], device: str, *,
                  generic: bool = True) -> tuple[int, str | None]:
    """Compile the kernels ``part``'s calls reach on inputs like ``signatures``; returns the compilations started
    and the first exception a call raised (None if none did). ``generic``: without Triton's integer and alignment
    specialization, as the correctness calls compile (:func:`specialization.generic`); else as Triton does, as the
    speed measurement compiles. In Triton's interpreter, where the grader sends no such request, the calls would
    run their kernels on the zero-filled inputs: nothing compiles there."""
    if not signatures:
        return 0, None
    try:
        from triton.runtime import _async_compile
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return 0, "this Triton has no asynchronous compilation"
    error: str | None = None
    with concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="compile-ahead") as threads:
        compiling = AsyncCompileMode(threads, ignore_errors=True)
        try:
            compiling.__enter__()
        except RuntimeError:  # the student's own asynchronous compilation is under way
            return 0, "another asynchronous compilation is under way"
        try:
            with (specialization.generic() if generic else contextlib.nullcontext(), specialization.compiling_only(),
                  torch.autograd.set_multithreading_enabled(False)):
                for signature in signatures:
                    try:
                        part.call(module, {name: _like(value, device) for name, value in signature.items()})
                    except Exception as exc:  # met again, and reported, when its case runs
                        error = error or f"{type(exc).__name__}: {exc}"
        finally:
            started = len(getattr(compiling, "raw_futures", ()))
            try:
                with gpu_gate.current().released():  # waiting for the compiler is not GPU work: nobody waits
                    compiling.__exit__(None, None, None)
            finally:  # some Triton versions leave it set when a compilation raised a BaseException
                _async_compile.active_mode.set(None)
    return started, error


def _like(value: Any, device: str) -> Any:
    """A zero-filled tensor on ``device`` with ``value``'s shape, dtype and strides (a meta tensor has no values);
    anything else as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    like = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)
    return like.zero_() if like.numel() else like
