"""Integrity rules: the tested call must do its work in the student's own Triton kernels.

``Monitor`` observes one call of a student function:

* every aten op dispatched by PyTorch *outside* Triton launches (a ``TorchDispatchMode``), so that
  ``torch.softmax`` or ``a @ b`` inside the call is seen by name;
* every Triton launch (``JITFunction.run`` on the GPU, ``InterpretedFunction.run`` in the
  interpreter, which autotuners also go through) with the file its kernel is defined in.

Interpreted launches also run inside guard bands (:mod:`grader.guard`), so an out-of-bounds store
is reported instead of crashing the process.

Ops the interpreter issues while it launches (host copies of the arguments) are not recorded: the
launch hook pauses recording. Observations are plain data; :func:`flags_for` turns them into flags in
whatever process computes the verdict.

Memory the call allocates uninitialized (``torch.empty`` and friends) is filled with a never-written
pattern (:data:`grader.checks.tensors.UNWRITTEN_BITS`), so an output element that no kernel wrote is
recognised as such, on a CPU and a GPU alike, and never confused with a NaN the kernel computed.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grader.checks import guard, tensors

# Allocation, views, copies and dtype casts are bookkeeping, not computation.
ALLOWED_OPS = frozenset(
    """
    empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros zero_ fill_
    full full_like new_full ones ones_like new_ones scalar_tensor lift_fresh lift_fresh_copy
    view _unsafe_view reshape as_strided t transpose permute expand expand_as unsqueeze squeeze
    flatten unflatten select slice narrow split split_with_sizes unbind chunk movedim alias detach
    contiguous clone copy_ _to_copy to _copy_from _copy_from_and_resize set_ resize_ _reshape_alias
    view_as real imag is_same_size _has_compatible_shallow_copy_type stride size sym_size sym_stride
    sym_numel sym_storage_offset numel dim is_contiguous
    """.split()
)

# Factory ops whose memory is uninitialized: filled with the never-written pattern inside a monitored call.
UNINITIALIZED_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                               "empty_permuted"})


@dataclass
class Observation:
    ops: list[str] = field(default_factory=list)  # aten op names, in order, outside launches
    kernels: list[tuple[str, str]] = field(default_factory=list)  # (kernel name, defining file)
    # storages created by those ops (output storage shared with no argument): data_ptr -> bytes
    allocations: dict[int, int] = field(default_factory=dict)

    @property
    def allocated_bytes(self) -> int:
        return sum(self.allocations.values())


@dataclass(frozen=True)
class Flag:
    rule: str  # "no-torch-compute", "own-kernel", "inputs-unchanged", "no-aliasing", ...
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message}


class _OpRecorder(TorchDispatchMode):
    def __init__(self, observation: Observation):
        super().__init__()
        self.observation = observation
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.paused:
            name = func.overloadpacket.__name__
            self.observation.ops.append(name)
            self._record_allocations(out, [*args, *kwargs.values()])
            if name in UNINITIALIZED_OPS and isinstance(out, torch.Tensor):
                tensors.fill_unwritten(out)  # this mode is off inside __torch_dispatch__: not recorded
        return out

    def _record_allocations(self, out, inputs) -> None:
        """A view or in-place result shares an argument's storage; anything else is a new allocation."""
        seen = {t.untyped_storage().data_ptr() for t in tensors_in(inputs)}
        for t in tensors_in(out if isinstance(out, tuple | list) else [out]):
            if t.device.type != "meta":
                storage = t.untyped_storage()
                if storage.data_ptr() not in seen:
                    self.observation.allocations.setdefault(storage.data_ptr(), storage.nbytes())


def tensors_in(values) -> list[torch.Tensor]:
    """The tensors among ``values``, looking inside tuples and lists."""
    found = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, tuple | list):
            found.extend(tensors_in(v))
    return found


def _kernel_file(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    try:
        return os.path.realpath(inspect.getsourcefile(fn) or "")
    except TypeError:
        return ""


@contextlib.contextmanager
def launches_through(around: Callable[..., Any]) -> Iterator[None]:
    """While the block runs, every Triton launch (``JITFunction.run``; ``InterpretedFunction.run`` in the
    interpreter) goes through ``around(kernel, interpreted, launch, args, kwargs, grid, warmup)``, which calls
    ``launch(*args, **kwargs)`` (the launch itself) and returns its result."""
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    originals = {cls: cls.__dict__["run"] for cls in classes if "run" in cls.__dict__}

    def wrap(cls, original):
        interpreted = cls is not JITFunction

        def run(self, *args, grid, warmup, **kwargs):
            launch = lambda *a, **k: original(self, *a, grid=grid, warmup=warmup, **k)
            return around(self, interpreted, launch, args, kwargs, grid, warmup)

        return run

    for cls, original in originals.items():
        cls.run = wrap(cls, original)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.run = original


@contextlib.contextmanager
def monitor() -> Iterator[Observation]:
    """Record aten ops and Triton launches made inside the ``with`` block."""
    observation = Observation()
    recorder = _OpRecorder(observation)

    def around(kernel, interpreted, launch, args, kwargs, grid, warmup):
        name = getattr(kernel.fn, "__name__", "?")
        if not warmup:
            observation.kernels.append((name, _kernel_file(kernel)))
        recorder.paused += 1
        try:
            if interpreted and not warmup:
                return guard.guarded_launch(launch, name, kernel.arg_names, args, kwargs)
            return launch(*args, **kwargs)
        finally:
            recorder.paused -= 1

    with launches_through(around), recorder:
        yield observation


def flags_for(
    observation: Observation,
    *,
    function: str,
    student_dir: str,
    allowed_ops: Iterable[str] = (),
) -> list[Flag]:
    """Flags for one observed call: PyTorch compute ops, and no launch of the student's own kernel."""
    flags = []
    allowed = ALLOWED_OPS | frozenset(allowed_ops)
    forbidden = sorted({op for op in observation.ops if op not in allowed})
    if forbidden:
        names = ", ".join(f"aten.{op}" for op in forbidden[:6])
        flags.append(
            Flag(
                "no-torch-compute",
                f"{function} called {names} — write the computation as a Triton kernel",
            )
        )
    root = os.path.realpath(student_dir) + os.sep
    own = [name for name, path in observation.kernels if path.startswith(root)]
    if not own:
        seen = ", ".join(sorted({name for name, _ in observation.kernels})) or "none"
        flags.append(
            Flag(
                "own-kernel",
                f"{function} launched no Triton kernel defined in its own module "
                f"(kernels launched: {seen})",
            )
        )
    return flags


def storages_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if two tensors' storages share memory."""
    if a.device != b.device:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes() and sa.nbytes() > 0 and sb.nbytes() > 0
