"""Triton's compilations in a worker, told apart from the student's call: the worker's side.

A call's time limit counts the call, not Triton compiling the student's kernels: one kernel autotuned over many
configurations with a block as wide as a 65536-column row compiles for minutes on a host whose cores are shared by
a batch, and in seconds on an idle one. :func:`install` wraps ``triton.compiler.compile`` (every JIT compilation
and every autotuning candidate goes through it) so that the worker's watchdog stops while any compilation is under
way, and the grader is told when compiling starts (with the kernel and its constants, for the report) and ends; the
grader's side (:class:`grader.grading.exercise_run.workers.Worker`) moves the call's limits on by as much and holds
a compilation to a limit of its own.

Overlapping compilations (autotuning candidates compiled on threads) count once: the clock stops when the first
starts and goes on when the last ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class CompileClock:
    """Counts compilations under way; ``on_start(what)`` when the first starts, ``on_end(seconds)`` when the last
    ends."""

    def __init__(self, on_start: Callable[[str], None], on_end: Callable[[float], None]):
        self._on_start, self._on_end = on_start, on_end
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0

    def wrap(self, compile_kernel: Callable[..., Any]) -> Callable[..., Any]:
        def compile_counted(*args: Any, **kwargs: Any) -> Any:
            self._enter(describe(args[0] if args else kwargs.get("src")))
            try:
                return compile_kernel(*args, **kwargs)
            finally:
                self._exit()

        compile_counted._grader_compile_clock = True  # type: ignore[attr-defined]
        return compile_counted

    def _enter(self, what: str) -> None:
        with self._lock:
            self._active += 1
            if self._active > 1:
                return
            self._since = time.monotonic()
            self._on_start(what)

    def _exit(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._on_end(time.monotonic() - self._since)


def describe(src: Any) -> str:
    """The kernel a compilation is for and its constants, e.g. ``_softmax_kernel (BLOCK_N=65536, num_warps=8)``;
    only what a Triton ``ASTSource`` says of itself, never an error."""
    try:
        fn = getattr(src, "fn", None)
        name = getattr(fn, "__name__", None) or getattr(src, "name", None) or type(src).__name__
        arg_names = list(getattr(fn, "arg_names", []) or [])
        constants = []
        for key, value in dict(getattr(src, "constexprs", {}) or {}).items():
            index = key[0] if isinstance(key, tuple) and len(key) == 1 else key
            label = arg_names[index] if isinstance(index, int) and index < len(arg_names) else str(key)
            if isinstance(value, bool | int | float | str):
                constants.append(f"{label}={value}")
        return f"{name} ({', '.join(constants)})" if constants else str(name)
    except Exception:  # a description is never worth a failure
        return "a kernel"


def install(clock: CompileClock) -> None:
    """Count every compilation of this process with ``clock`` (once; what the GPU gate wrapped stays wrapped)."""
    import triton.compiler as triton_compiler

    if getattr(triton_compiler.compile, "_grader_compile_clock", False):
        return
    triton_compiler.compile = clock.wrap(triton_compiler.compile)  # JITFunction takes it from here when it runs
