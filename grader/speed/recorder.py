"""Recording one call as a :class:`~grader.speed.plan.LaunchPlan`, in the process that imported the student's
module (the grader's worker, pytest, ``grader bench``).

While :func:`record_call` runs the part's call once, it sees

* every Triton launch: ``CompiledKernel.launch_metadata``, which Triton calls right before every launch
  with the resolved grid, the stream and the bound arguments (tensors, tensor descriptors, scalars,
  constexprs), on whichever thread launches (autograd's too);
* every aten op outside launches (a ``TorchDispatchMode``): views and allocations need nothing; copies, casts
  and fills become plan steps; anything else (``torch.exp``, ``.item()``, a copy to the host) makes the call
  *not replayable*, with the op's name;
* every CUDA event recorded and waited for through ``torch.cuda`` (``Stream.wait_stream`` included), so work
  spread over several streams keeps its order.

The recorder holds no reference to the call's tensors (holding one changes what the call does: autograd
copies a gradient it would otherwise take over). A storage an op creates at an address used before is a
new buffer of the plan, so memory the allocator reuses within the call stays apart in the replay. A
call whose kernels are launched some other way (a raw CUDA launch, a library) leaves their work out of the
plan: the timer then finds the replayed outputs wrong and gives no speed credit.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grader.checks.integrity import tensors_in
from grader.speed.plan import Arg, Buffer, KernelImage, LaunchPlan, Step, View

# Views, allocations and metadata queries: no data moves, nothing to replay.
NO_WORK_OPS = frozenset(
    """
    empty empty_like empty_strided new_empty new_empty_strided empty_permuted lift_fresh
    view _unsafe_view reshape as_strided t transpose permute expand expand_as unsqueeze squeeze
    flatten unflatten select slice narrow split split_with_sizes unbind chunk movedim alias detach
    view_as real imag is_same_size _has_compatible_shallow_copy_type stride size sym_size sym_stride
    sym_numel sym_storage_offset numel dim is_contiguous _reshape_alias contiguous to
    """.split()
)
_COPIES = frozenset({"clone", "_to_copy", "lift_fresh_copy", "_copy_from"})
_FILLS = {"zeros": 0.0, "zeros_like": 0.0, "new_zeros": 0.0, "zero_": 0.0, "ones": 1.0, "ones_like": 1.0,
          "new_ones": 1.0}
_FILL_WITH_VALUE = frozenset({"fill_", "full", "full_like", "new_full", "scalar_tensor"})


class NotReplayable(Exception):
    """The call does something the timer cannot replay; the message says what and where."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Recording:
    def __init__(self, inputs: Mapping[str, Any]):
        self.plan = LaunchPlan()
        self.problem: str | None = None
        self.lock = threading.RLock()
        self.keep: list[Any] = []  # the compiled kernels launched (never tensors: see the module docstring)
        self.buffers: dict[int, int] = {}  # storage address -> buffer index
        self.kernels: dict[int, int] = {}  # id(CompiledKernel) -> kernel index
        self.streams: dict[int, int] = {}  # CUDA stream handle -> plan stream
        self.events: dict[int, int] = {}  # id(torch.cuda.Event) -> the plan event it last recorded
        self.event_objects: list[Any] = []
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor) and value.untyped_storage().nbytes():
                storage = value.untyped_storage()
                self.buffers[storage.data_ptr()] = len(self.plan.buffers)
                self.plan.buffers.append(Buffer("input", storage.nbytes(), name))

    def fail(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem

    def stream(self, handle: int) -> int:
        return self.streams.setdefault(int(handle), len(self.streams))

    def view(self, t: torch.Tensor) -> View:
        if t.device.type != "cuda":
            raise NotReplayable(f"a {t.device.type} tensor reached the GPU work (only CUDA tensors are replayed)")
        storage = t.untyped_storage()
        base = storage.data_ptr()
        index = self.buffers.get(base)
        if index is None or self.plan.buffers[index].nbytes < storage.nbytes():
            index = self.allocated(t)
        return View(index, t.data_ptr() - base, dtype_name(t.dtype), tuple(t.shape), tuple(t.stride()))

    def allocated(self, t: torch.Tensor) -> int:
        """``t``'s storage is new: a buffer of its own, whatever was at its address before."""
        storage = t.untyped_storage()
        index = self.buffers[storage.data_ptr()] = len(self.plan.buffers)
        self.plan.buffers.append(Buffer("scratch", storage.nbytes()))
        return index

    def kernel(self, compiled: Any) -> int:
        index = self.kernels.get(id(compiled))
        if index is None:
            self.keep.append(compiled)
            index = self.kernels[id(compiled)] = len(self.plan.kernels)
            self.plan.kernels.append(kernel_image(compiled))
        return index

    def launch(self, compiled: Any, grid: Any, stream: int, args: tuple) -> None:
        kernel = self.kernel(compiled)
        signature = self.plan.kernels[kernel].signature
        dims = [int(g) for g in (grid if isinstance(grid, tuple | list) else (grid,))]
        if not 1 <= len(dims) <= 3:
            raise NotReplayable(f"{compiled.name} was launched with a grid of {len(dims)} dimensions")
        dims += [1] * (3 - len(dims))
        if len(args) != len(signature):
            raise NotReplayable(f"{compiled.name} was launched with {len(args)} arguments for "
                                f"{len(signature)} parameters")
        plan_args = tuple(self.arg(value, ty, compiled.name, name)
                          for value, (name, ty) in zip(args, signature.items()))
        self.plan.steps.append(Step("launch", self.stream(stream), kernel, tuple(dims), plan_args))

    def arg(self, value: Any, ty: str, kernel: str, name: str) -> Arg:
        if ty == "constexpr":  # compiled in; its value kept for the reports (an autotuner's choice shows there)
            return Arg("constexpr", value=value if isinstance(value, bool | int | float) else None)
        if ty.startswith("*"):
            if not isinstance(value, torch.Tensor):
                raise NotReplayable(f"{kernel}'s pointer argument {name} is a {type(value).__name__}, not a tensor")
            return Arg("tensor", self.view(value))
        if ty.startswith("tensordesc"):
            base = getattr(value, "base", None)
            if not isinstance(base, torch.Tensor):
                raise NotReplayable(f"{kernel}'s argument {name} is a tensor descriptor without a tensor base")
            return Arg("descriptor", self.view(base), shape=tuple(int(v) for v in value.shape),
                       strides=tuple(int(v) for v in value.strides),
                       block_shape=tuple(int(v) for v in value.block_shape), padding=str(value.padding))
        if hasattr(value, "item") and not isinstance(value, torch.Tensor):  # a numpy scalar
            value = value.item()
        if not isinstance(value, int | float | bool):
            raise NotReplayable(f"{kernel}'s argument {name} is a {type(value).__name__}, not a number")
        return Arg("scalar", value=value)

    def op(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        current = self.stream(torch.cuda.current_stream().cuda_stream)
        given = {t.untyped_storage().data_ptr() for t in tensors_in([*args, *kwargs.values()])}
        for t in tensors_in(out if isinstance(out, tuple | list) else [out]):
            if t.device.type == "cuda" and t.untyped_storage().nbytes() and t.untyped_storage().data_ptr() not in given:
                self.allocated(t)
        if name in NO_WORK_OPS:
            return
        if name == "copy_":
            dst, src = args[0], args[1]
            if not isinstance(src, torch.Tensor) or src.device.type != "cuda" or dst.device.type != "cuda":
                raise NotReplayable("the call copies data between the host and the GPU (aten.copy_): only GPU "
                                    "copies are replayed")
            self._copy(self.view(dst), self.view(_broadcast(src, dst)), current)
        elif name in _COPIES:
            if not isinstance(out, torch.Tensor) or out.device.type != "cuda":
                raise NotReplayable(f"the call reads a result back to the host (aten.{name})")
            self._copy(self.view(out), self.view(args[0]), current)
        elif name in _FILLS or name in _FILL_WITH_VALUE:
            target = args[0] if name.endswith("_") else out
            value = _FILLS.get(name)
            if value is None:
                value = kwargs.get("fill_value", args[1] if len(args) > 1 and name != "scalar_tensor" else args[0])
                if isinstance(value, torch.Tensor):
                    raise NotReplayable(f"the call fills memory with a value held in a tensor (aten.{name})")
            self.plan.steps.append(Step("fill", current, dst=self.view(target), value=float(value)))
        elif name in ("_local_scalar_dense", "item", "tolist"):
            raise NotReplayable("the call reads a value back from the GPU (.item(), a Python number from a tensor): "
                                "its launches would depend on data")
        else:
            raise NotReplayable(f"the call runs the PyTorch op aten.{name}: only Triton launches, allocations, views, "
                                "copies, casts and fills are replayed")

    def _copy(self, dst: View, src: View, stream: int) -> None:
        if math.prod(dst.shape) != math.prod(src.shape):
            raise NotReplayable("a copy between tensors of different sizes")
        self.plan.steps.append(Step("copy", stream, dst=dst, src=src))

    def record_event(self, event: Any, stream: Any) -> None:
        handle = (stream if stream is not None else torch.cuda.current_stream()).cuda_stream
        number = len(self.event_objects)
        self.event_objects.append(event)
        self.events[id(event)] = number
        self.plan.steps.append(Step("record", self.stream(handle), event=number))

    def wait_event(self, stream: Any, event: Any) -> None:
        number = self.events.get(id(event))
        if number is None:
            raise NotReplayable("a stream waits for a CUDA event recorded before the call")
        self.plan.steps.append(Step("wait", self.stream(stream.cuda_stream), event=number))


def _broadcast(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return src.expand_as(dst) if src.shape != dst.shape else src


def kernel_image(compiled: Any) -> KernelImage:
    """A compiled kernel as data: its metadata JSON and cubin, and its launcher signature."""
    src = compiled.src
    signature = getattr(src, "signature", None)
    if getattr(src, "fn", None) is None or not isinstance(signature, dict):
        raise NotReplayable(f"{compiled.name} was not compiled from a @triton.jit function")
    if any(not isinstance(t, str) for t in signature.values()):
        raise NotReplayable(f"{compiled.name} takes tuple arguments, which the timer does not replay")
    cubin = compiled.asm.get("cubin") if hasattr(compiled.asm, "get") else None
    if not isinstance(cubin, bytes):
        raise NotReplayable(f"{compiled.name} has no CUDA binary (cubin)")
    json_path = next((p for c, p in compiled.metadata_group.items() if c.endswith(".json")), None)
    if json_path is None:
        raise NotReplayable(f"{compiled.name} has no metadata in Triton's cache")
    return KernelImage(compiled.name, Path(json_path).read_text(), cubin, {str(k): v for k, v in signature.items()})


class _Ops(TorchDispatchMode):
    def __init__(self, recording: _Recording):
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        recording = self.recording
        with recording.lock:
            try:
                recording.op(func.overloadpacket.__name__, args, kwargs, out)
            except NotReplayable as exc:
                recording.fail(str(exc))
        return out


@contextlib.contextmanager
def _patched(recording: _Recording) -> Iterator[None]:
    from triton.compiler.compiler import CompiledKernel

    original = CompiledKernel.launch_metadata
    record, wait = torch.cuda.Event.record, torch.cuda.Stream.wait_event

    def launch_metadata(self, grid, stream, *args):
        with recording.lock:
            try:
                recording.launch(self, grid, stream, args)
            except NotReplayable as exc:
                recording.fail(str(exc))
        return original(self, grid, stream, *args)

    def record_event(self, stream=None):
        with recording.lock:
            recording.record_event(self, stream)
        return record(self, stream) if stream is not None else record(self)

    def wait_event(self, event):
        with recording.lock:
            try:
                recording.wait_event(self, event)
            except NotReplayable as exc:
                recording.fail(str(exc))
        return wait(self, event)

    CompiledKernel.launch_metadata = launch_metadata
    torch.cuda.Event.record = record_event
    torch.cuda.Stream.wait_event = wait_event
    try:
        yield
    finally:
        CompiledKernel.launch_metadata = original
        torch.cuda.Event.record = record
        torch.cuda.Stream.wait_event = wait


def record_call(call, inputs: Mapping[str, Any]) -> tuple[Any, LaunchPlan]:
    """Run ``call(inputs)`` once, recording it; return its outputs (a dict of tensors) and its plan.
    Raises :class:`NotReplayable` when the call does something the timer cannot replay."""
    recording = _Recording(inputs)
    recording.stream(torch.cuda.current_stream().cuda_stream)  # stream 0: where the call starts
    with _patched(recording), _Ops(recording):
        outputs = call(inputs)
    torch.cuda.synchronize()
    if recording.problem:
        raise NotReplayable(recording.problem)
    if not isinstance(outputs, Mapping):
        raise NotReplayable(f"the call returned {type(outputs).__name__}, not its outputs")
    for name, t in outputs.items():
        if not isinstance(t, torch.Tensor):
            raise NotReplayable(f"output {name!r} is a {type(t).__name__}, not a tensor")
        view = recording.view(t)
        buffer = recording.plan.buffers[view.buffer]
        if buffer.role == "input":
            raise NotReplayable(f"output {name!r} shares memory with input {buffer.name!r}")
        recording.plan.buffers[view.buffer] = Buffer("output", buffer.nbytes, buffer.name or name)
        recording.plan.outputs[name] = view
    if not recording.plan.launches:
        raise NotReplayable("the call launched no Triton kernel")
    return outputs, recording.plan
