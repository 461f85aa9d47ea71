"""Correctness calls compile each Triton kernel once per dtype and constexpr values, not once per shape.

Triton specializes a kernel on its integer arguments (equal to 1, divisible by 16) and on the alignment of its
pointers, and compiles it again for each combination it meets: the random cases' shapes and layouts meet many
(on an H100, the reference solutions' correctness cases compiled 242 kernels in 76 s; without these
specializations, 160 in 55 s). Specializing is an optimization that never changes what a kernel computes, and
correctness calls are not timed, so the grader's worker runs them with it off (:func:`generic`); the speed
measurement compiles and runs the kernels as Triton does by default, in a cache of its own.

:func:`install` patches Triton's ``JITFunction.run`` once (the worker only; pytest and ``grader bench`` leave
Triton alone): inside :func:`generic`, each kernel looks up and compiles its kernels through a second set of
caches whose binders treat every non-constexpr argument as ``do_not_specialize`` and
``do_not_specialize_on_alignment``.
"""

from __future__ import annotations

import contextlib
import types
from collections import defaultdict
from collections.abc import Iterator

# Process-wide, not per thread: PyTorch runs a CUDA backward pass on a thread of its autograd engine, whose
# kernels belong to the correctness call that ran backward() (the worker runs one request at a time).
_state = types.SimpleNamespace()
_installed = False


@contextlib.contextmanager
def generic() -> Iterator[None]:
    """Run the block's Triton kernels without integer and alignment specialization (this process: a backward pass
    on the autograd engine's thread too)."""
    with _mode("generic"):
        yield


@contextlib.contextmanager
def compiling_only() -> Iterator[None]:
    """Within the block, a Triton kernel called to run is compiled (or found compiled) and not launched, as
    ``warmup=True`` does: the calls of :mod:`grader.checks.compile_ahead` (this process: every thread)."""
    with _mode("compiling_only"):
        yield


@contextlib.contextmanager
def _mode(name: str) -> Iterator[None]:
    previous = getattr(_state, name, False)
    setattr(_state, name, True)
    try:
        yield
    finally:
        setattr(_state, name, previous)


def install() -> bool:
    """Patch Triton's ``JITFunction.run`` (once per process); False where this Triton's is not the one this module
    knows (then every call specializes, as usual)."""
    global _installed
    if _installed:
        return True
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    run, create_binder = getattr(JITFunction, "run", None), getattr(JITFunction, "create_binder", None)
    if run is None or create_binder is None:
        return False

    def generic_binder(fn):
        flags = [(p, p.do_not_specialize, p.do_not_specialize_on_alignment) for p in fn.params]
        try:
            for p in fn.params:
                if not p.is_constexpr:
                    p.do_not_specialize = p.do_not_specialize_on_alignment = True
            return create_binder(fn)  # the binder is generated code: it keeps the flags it was made with
        finally:
            for p, specialize, align in flags:
                p.do_not_specialize, p.do_not_specialize_on_alignment = specialize, align

    def patched_run(self, *args, **kwargs):
        if getattr(_state, "compiling_only", False):
            kwargs["warmup"] = True
        if not getattr(_state, "generic", False) or not hasattr(self, "device_caches"):
            return run(self, *args, **kwargs)
        caches = self.__dict__.get("_grader_generic_caches")
        if caches is None:
            caches = self.__dict__["_grader_generic_caches"] = defaultdict(lambda: generic_binder(self))
        specialized = self.device_caches
        self.device_caches = caches
        try:
            return run(self, *args, **kwargs)
        finally:
            self.device_caches = specialized

    _original["run"] = run
    JITFunction.run = patched_run
    _installed = True
    return True


_original: dict = {}  # Triton's own JITFunction.run ("run"), which uninstall() puts back


def installed() -> bool:
    return _installed


def uninstall() -> None:
    """Give Triton its own ``JITFunction.run`` back (a process that installed the patch for a while: the tests)."""
    global _installed
    if _installed:
        from triton.runtime.jit import JITFunction

        JITFunction.run = _original.pop("run")
        _installed = False
