"""Replaying a :class:`~grader.speed.plan.LaunchPlan` in the trusted timer: the student's compiled kernels on
the timer's own buffers, launched by Triton's own loader and launcher, without the student's Python.

:class:`Replay` loads each kernel image (metadata JSON and cubin, written to a private folder) as a Triton
``CompiledKernel``, exactly as Triton loads a kernel from its cache in a new process, and builds its
launcher from the recorded signature. A call of the replay takes the inputs (the timer's tensors, laid
out as the benchmark's inputs are), allocates the outputs and scratch buffers, runs the steps on the
current stream (and side streams of its own where the call used several: the current stream waits for
all of them at the end, so every kernel's time is counted) and returns the outputs as tensors.

No call finds what an earlier call left in its memory. The caching allocator hands freed memory back with its
contents, so a kernel could keep its results in its scratch (or output) memory and, given the same input again,
return them without computing. :meth:`Replay.stage`, which the timing engine runs before every call, outside the
timed region (:class:`grader.speed.timing.Candidate`'s ``setup``), allocates the next call's outputs and scratch
and fills them with :data:`POISON_BYTE`; it returns a callable that fills that same memory again, which graph
mode runs before each replay of a captured call (a CUDA graph runs on the same memory every time).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from grader.speed.plan import Arg, LaunchPlan, View

_DTYPES = {name: getattr(torch, name) for name in ("float16", "bfloat16", "float32", "float64", "int8", "uint8",
                                                      "int16", "int32", "int64", "bool")}
POISON_BYTE = 0xFF  # every float format reads it as NaN: an element no replayed kernel wrote stands out


class ReplayError(RuntimeError):
    """The plan could not be loaded or launched (a kernel that does not load, a launch the driver refuses)."""


def _cuda_bytes(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def poison(memory: Sequence[torch.Tensor]) -> None:
    """Fill every byte of ``memory`` with :data:`POISON_BYTE` (one memset each, on the current stream)."""
    for block in memory:
        block.fill_(POISON_BYTE)


class CallMemory:
    """The outputs and scratch memory of a replay's calls (``sizes``: their bytes, in the plan's order), each call
    its own, as the student's call allocated them. :meth:`stage` allocates the next call's memory ahead of it and
    poisons it; :meth:`take` hands a call the memory staged for it (once), or else memory allocated then, poisoned
    only where asked (validation runs). ``allocate(nbytes)`` gives a byte tensor (the GPU's by default)."""

    def __init__(self, sizes: Sequence[int], allocate: Callable[[int], torch.Tensor] = _cuda_bytes):
        self.sizes = [int(n) for n in sizes]
        self._allocate = allocate
        self._staged: list[torch.Tensor] | None = None

    @property
    def nbytes(self) -> int:
        """What one call's poisoning fills."""
        return sum(self.sizes)

    def stage(self) -> Callable[[], None]:
        """Allocate the next call's memory and poison it; returns a callable that poisons that memory again (a
        captured graph's replays all run on the memory of the captured call). A memory staged earlier and not
        taken is dropped."""
        self._staged = None  # freed first: the allocator may hand it back, and it is poisoned either way
        memory = [self._allocate(n) for n in self.sizes]
        poison(memory)
        self._staged = memory
        return lambda: poison(memory)

    def take(self, *, poisoned: bool = False) -> list[torch.Tensor]:
        """The memory for a call: the staged one (already poisoned), else fresh, poisoned if ``poisoned``."""
        memory, self._staged = self._staged, None
        if memory is None:
            memory = [self._allocate(n) for n in self.sizes]
            if poisoned:
                poison(memory)
        return memory


def _load(index: int, image, folder: Path):
    from triton.compiler.compiler import CompiledKernel

    folder.mkdir(parents=True, exist_ok=True)
    try:
        metadata = json.loads(image.metadata_json)
    except json.JSONDecodeError as exc:
        raise ReplayError(f"kernel {image.name}: its metadata is not JSON ({exc})") from None
    if not isinstance(metadata, dict) or metadata.get("name") != image.name:
        raise ReplayError(f"kernel {image.name}: its metadata names another kernel")
    json_path, cubin_path = folder / f"k{index}.json", folder / f"k{index}.cubin"
    json_path.write_text(image.metadata_json)
    cubin_path.write_bytes(image.cubin)
    # What Triton's launcher reads of a kernel's source: the signature (constexprs are compiled in).
    src = SimpleNamespace(signature=dict(image.signature), constants={}, fn=None)
    try:
        kernel = CompiledKernel(src, {json_path.name: str(json_path), cubin_path.name: str(cubin_path)},
                                f"replay-{index}")
        kernel._init_handles()  # loads the module and builds the launcher now, not inside a timed call
    except Exception as exc:
        raise ReplayError(f"kernel {image.name} could not be loaded: {type(exc).__name__}: {exc}") from None
    return kernel


class Replay:
    """A plan made callable: ``replay(inputs) -> outputs``."""

    def __init__(self, plan: LaunchPlan, folder: Path):
        if not torch.cuda.is_available():
            raise ReplayError("replaying kernels needs a CUDA GPU")
        self.plan = plan
        self.kernels = [_load(i, image, folder / "kernels") for i, image in enumerate(plan.kernels)]
        used = sorted({s.stream for s in plan.steps} - {0})
        self.side = {n: torch.cuda.Stream() for n in used}
        self.poison = False  # fill outputs and scratch with NaN before the steps (validation runs)
        self.memory = CallMemory([buf.nbytes for buf in plan.buffers if buf.role != "input"])
        _allocator()

    def stage(self) -> Callable[[], None]:
        """Allocate the next call's outputs and scratch and fill them with NaN (:meth:`CallMemory.stage`), outside
        any timed region: what the timing engine runs before every call (``Candidate.setup``)."""
        return self.memory.stage()

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        plan = self.plan
        memory = iter(self.memory.take(poisoned=self.poison))
        storages: list[torch.UntypedStorage] = []
        for buf in plan.buffers:
            if buf.role == "input":
                storages.append(inputs[buf.name].untyped_storage())
            else:
                storages.append(next(memory).untyped_storage())
        main = torch.cuda.current_stream()
        streams = {0: main, **self.side}
        for stream in self.side.values():  # side streams start after what the current stream has queued
            stream.wait_stream(main)
        events: dict[int, torch.cuda.Event] = {}
        for step in plan.steps:
            stream = streams[step.stream]
            match step.op:
                case "launch":
                    kernel = self.kernels[step.kernel]
                    args = [_arg(a, storages) for a in step.args]
                    kernel.run(*step.grid, stream.cuda_stream, kernel.function, kernel.packed_metadata, None, None,
                               None, *args)
                case "copy":
                    with torch.cuda.stream(stream):
                        _view(step.dst, storages).copy_(_view(step.src, storages))
                case "fill":
                    with torch.cuda.stream(stream):
                        _view(step.dst, storages).fill_(step.value)
                case "record":
                    events[step.event] = torch.cuda.Event()
                    events[step.event].record(stream)
                case "wait":
                    stream.wait_event(events[step.event])
        for stream in self.side.values():
            main.wait_stream(stream)
        return {name: _view(view, storages) for name, view in plan.outputs.items()}


def _view(view: View | None, storages: list[torch.UntypedStorage]) -> torch.Tensor:
    assert view is not None  # plan_checks.problems() refused plans without one
    dtype = _DTYPES[view.dtype]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return torch.empty(0, dtype=dtype, device="cuda").set_(storages[view.buffer], view.offset // itemsize,
                                                           view.shape, view.strides)


def _arg(arg: Arg, storages: list[torch.UntypedStorage]) -> Any:
    match arg.kind:
        case "tensor":
            return _view(arg.view, storages)
        case "descriptor":
            from triton.tools.tensor_descriptor import TensorDescriptor

            return TensorDescriptor(_view(arg.view, storages), list(arg.shape), list(arg.strides),
                                    list(arg.block_shape), arg.padding)
        case "scalar":
            return arg.value
    return None  # a constexpr: compiled into the kernel, ignored by the launcher


_ALLOCATOR_SET = False


def _allocator() -> None:
    """Kernels that need global scratch memory (device-side tensor descriptors) get it from PyTorch."""
    global _ALLOCATOR_SET
    if _ALLOCATOR_SET:
        return
    import triton

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device="cuda")

    if hasattr(triton, "set_allocator"):
        triton.set_allocator(alloc)
    _ALLOCATOR_SET = True
