"""Recognize failures that come from the Triton interpreter (or the installed Triton), not from the student's kernel.

Without a GPU, kernels run in the Triton interpreter (``TRITON_INTERPRET=1``), which cannot do everything the GPU
does: libdevice and ``tl.extra.cuda`` functions, inline assembly, float or bool kernel arguments used as tensors,
bfloat16 constants and comparisons. Those raise errors that read like the student's bug. :func:`note` matches an
exception against the known signatures (each verified on triton 3.6.0) and returns a line saying so, with advice;
:data:`BF16_NOTE` is the note for bfloat16 results the interpreter computes wrongly without raising. Nothing here
imports triton: the grader must set ``TRITON_INTERPRET`` before triton is first imported.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType, ModuleType

INTERPRETER = "this is a limit of the Triton interpreter (CPU), not necessarily a bug in your kernel"
MAY_BE = "this may be a limit of the Triton interpreter (CPU), not necessarily a bug in your kernel"
CAST = "cast to tl.float32 first (x.to(tl.float32)), compute in fp32 and cast back at the store, or run on a GPU"
BF16_NOTE = (f"note: {MAY_BE}: it computes bfloat16 arithmetic and tl.dot on bfloat16 wrongly unless the values are "
             "cast to tl.float32 first (x.to(tl.float32)); if your fp32 cases pass, cast and retry, or run on a GPU")

Kinds = type[BaseException] | tuple[type[BaseException], ...]


def mentions_limit(text: str | None) -> bool:
    """Whether a recorded error or message carries an interpreter note (the marker reports can show)."""
    return bool(text) and ("limit of the Triton interpreter" in text)


@dataclass(frozen=True)
class Failure:
    """One exception as the signatures see it: its chain and the frames it was raised through."""

    chain: list[BaseException]  # the exception, then its causes/contexts

    def frames(self) -> Iterator[tuple[FrameType, int]]:
        for exc in self.chain:
            tb = exc.__traceback__
            while tb is not None:
                yield tb.tb_frame, tb.tb_lineno
                tb = tb.tb_next

    def matching(self, kind: Kinds, pattern: str) -> re.Match[str] | None:
        return next((m for e in self.chain if isinstance(e, kind) and (m := re.search(pattern, str(e)))), None)

    @property
    def in_kernel(self) -> bool:
        """Raised while the interpreter ran a kernel: it wraps every such exception in its InterpreterError."""
        return any(type(e).__name__ == "InterpreterError" and type(e).__module__.startswith("triton")
                   for e in self.chain)

    def through(self, module_file: str) -> bool:
        """Raised through triton's ``module_file`` (e.g. ``runtime/interpreter.py``)."""
        target = os.path.join(triton_dir() or "\0", *module_file.split("/"))
        return any(os.path.abspath(frame.f_code.co_filename) == target for frame, _ in self.frames())

    def student_frames(self) -> Iterator[tuple[FrameType, int]]:
        """The frames outside triton and torch (the student's kernel and host code, and the grader's)."""
        roots = tuple(root for name in ("triton", "torch") if (root := package_dir(name)))
        return ((f, n) for f, n in self.frames() if not os.path.abspath(f.f_code.co_filename).startswith(roots))


def package_dir(name: str) -> str | None:
    """An imported package's folder (None before anything imports it)."""
    file = getattr(sys.modules.get(name), "__file__", None)
    return os.path.dirname(os.path.abspath(file)) + os.sep if file else None


def triton_dir() -> str | None:
    return package_dir("triton")


def raised_inside_triton(exc: BaseException) -> bool:
    """The innermost frame of ``exc`` is triton's: a NotImplementedError from there is no unwritten stub."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb.tb_frame.f_code.co_filename, tb.tb_next
    root = triton_dir()
    return bool(root and last and os.path.abspath(last).startswith(root))


def _uses_libdevice(failure: Failure) -> bool:
    """The kernel's module imported a libdevice, or the failing line names one: its stubs return None here."""
    for frame, lineno in failure.student_frames():
        if "libdevice" in linecache.getline(frame.f_code.co_filename, lineno):
            return True
        for value in frame.f_globals.values():
            name = getattr(value, "__name__", "") if isinstance(value, ModuleType) else getattr(value, "__module__", "")
            if isinstance(name, str) and "libdevice" in name:
                return True
    return False


def _builtin_name(failure: Failure) -> str:
    """The triton builtin called outside a kernel's patched scope (``core.builtin``'s wrapper holds it as ``fn``)."""
    for frame, _ in failure.frames():
        fn = frame.f_locals.get("fn") if frame.f_code.co_name == "wrapper" else None
        if callable(fn):
            return f"{fn.__name__}() ({getattr(fn, '__module__', 'triton')})"
    return "this function"


@dataclass(frozen=True)
class Signature:
    """An exception type and message pattern, where it must come from, and the advice it gets."""

    kind: Kinds
    pattern: str
    advice: Callable[[Failure, re.Match[str]], str]
    in_kernel: bool = False  # raised while the interpreter ran a kernel
    through: str | None = None  # raised through this file of triton
    extra: Callable[[Failure], bool] | None = None

    def advise(self, failure: Failure) -> str | None:
        found = failure.matching(self.kind, self.pattern)
        if found is None or (self.in_kernel and not failure.in_kernel):
            return None
        if (self.through and not failure.through(self.through)) or (self.extra and not self.extra(failure)):
            return None
        return self.advice(failure, found)


SIGNATURES = (
    # libdevice.tanh(x) and friends are empty stubs the GPU compiler replaces; here they return None.
    Signature((TypeError, AttributeError), r"NoneType|\bNone\b", in_kernel=True, extra=_uses_libdevice,
              advice=lambda f, m: "libdevice functions (triton.language.extra.libdevice) return None in the "
              "interpreter — they run only on a GPU; write it with tl.exp / tl.exp2 (e.g. tanh(z) = "
              "1 - 2 / (1 + tl.exp(2 * z))), or run on a GPU"),
    # tl.extra.cuda functions (smid, globaltimer, its libdevice, ...) are builtins the interpreter never patches.
    Signature(ValueError, r"_semantic` argument must be provided outside of JIT functions", in_kernel=True,
              advice=lambda f, m: f"{_builtin_name(f)} has no implementation in the interpreter — it runs only on "
              "a GPU; write it with tl / tl.math functions, or run on a GPU"),
    Signature(NotImplementedError, r"(inline_asm|extern_elementwise) not supported in interpreter mode",
              advice=lambda f, m: "inline assembly (tl.inline_asm_elementwise) and extern library calls run only on "
              "a GPU; write it with tl / tl.math functions, or run on a GPU"),
    # The interpreter turns int arguments into tensors but passes floats through as plain numbers.
    Signature(AttributeError, r"'(float|numpy\.\w+)' object has no attribute '(to|dtype)'", in_kernel=True,
              advice=lambda f, m: f"a float kernel argument stays a plain {m.group(1)} in the interpreter, with no "
              f".{m.group(2)} attribute (on a GPU it is an fp32 scalar); use it as it is (x * scale), or run on a GPU"),
    Signature(ValueError, r"primitive_bitwidth \(1 bits\) for triton type int1", through="runtime/interpreter.py",
              advice=lambda f, m: "the interpreter cannot pass a bool kernel argument; pass int(flag) or make the "
              "parameter tl.constexpr, or run on a GPU"),
    Signature(AttributeError, r"'InterpreterBuilder' object has no attribute '(\w+)'", in_kernel=True,
              advice=lambda f, m: "the interpreter cannot make a bfloat16 constant (tl.full / tl.zeros in bf16, or a "
              f"Python number combined with a bf16 value); {CAST}" if m.group(1) == "get_bf16" else
              f"the interpreter does not emulate this operation ({m.group(1)}); it runs on a GPU"),
    # Comparing two bf16 tensors makes a mask of half the size, which a later cast cannot reshape.
    Signature(ValueError, r"cannot reshape array of size \d+ into shape", in_kernel=True,
              through="runtime/interpreter.py",
              advice=lambda f, m: f"the interpreter mishandles bfloat16 values here (e.g. comparing two bf16 "
              f"tensors); {CAST}"),
)

# Not the interpreter's: Triton 3.9 removed block pointers, on the GPU and in the interpreter alike.
BLOCK_POINTERS = Signature(
    NotImplementedError, r"Block pointers have been removed",
    advice=lambda f, m: "note: this is a limit of the installed Triton, not a bug in your kernel: its version removed "
    "block pointers (tl.make_block_ptr, tl.advance); the course's Triton (pinned in .ci/constraints.txt, installed "
    "by `bash scripts/bootstrap.sh`) runs them — install it, or use pointer arithmetic")


def _chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def note(exc: BaseException, *, interpreter: bool | None = None) -> str | None:
    """The note for an exception a student's call raised, or None when no known limit explains it.
    ``interpreter``: whether kernels ran in the Triton interpreter (default: ``TRITON_INTERPRET=1``)."""
    if interpreter is None:
        interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    failure = Failure(_chain(exc))
    if (advice := BLOCK_POINTERS.advise(failure)) is not None:
        return advice
    if not interpreter:
        return None
    for signature in SIGNATURES:
        try:
            advice = signature.advise(failure)
        except Exception:  # a signature that cannot read this traceback never hides the student's error
            continue
        if advice is not None:
            return f"note: {INTERPRETER}: {advice}"
    return None
