"""The launches of one call, recorded for ``grader profile`` (:mod:`.profile`): every Triton launch (its kernel,
grid and the tensors it is handed) and every PyTorch op that does work, and on a GPU each one's time from
``torch.profiler``."""

from __future__ import annotations

import contextlib
import statistics
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grader.checks.integrity import launches_through, tensors_in
from grader.checks.tensors import device_inputs
from grader.speed.recorder import NO_WORK_OPS


@dataclass
class Launch:
    """One kernel launch of a call: a Triton kernel, or a PyTorch op (one or more kernels of its own on a GPU)."""

    kind: str  # "triton" | "torch" | "kernel" (seen only by the GPU's profiler: no grid or bytes)
    name: str
    grid: tuple[int, ...] | None
    storages: dict[int, int] = field(default_factory=dict, repr=False)  # the tensors it was handed: address -> bytes
    ms: float | None = None  # GPU time, where measured

    @property
    def nbytes(self) -> int:
        """The bytes of the tensors it was handed, each storage once: all it can read or write."""
        return sum(self.storages.values())


@dataclass
class CallProfile:
    """What one call of a candidate launched; ``error`` where the call failed."""

    candidate: str
    launches: list[Launch] = field(default_factory=list)
    error: str | None = None
    gpu_ms: float | None = None  # every kernel of the call added up, on a GPU
    span_ms: float | None = None  # from its first kernel's start to its last one's end (kernels on several
    # streams overlap: then less than gpu_ms; what grader bench times)


def _storages(values) -> dict[int, int]:
    """Storage address -> bytes of the tensors among ``values`` (a host-side TMA descriptor hands its kernel the
    tensor it describes: its ``base``)."""
    found = {}
    values = [getattr(v, "base", v) if type(v).__name__ == "TensorDescriptor" else v for v in values]
    for t in tensors_in(values):
        if t.device.type != "meta":
            storage = t.untyped_storage()
            found.setdefault(storage.data_ptr(), storage.nbytes())
    return found


def _grid(grid: Any, arg_names: list[str], args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    """The launch's grid as numbers (a callable grid is given the launch's arguments by name, as Triton does)."""
    if callable(grid):
        try:
            grid = grid({**dict(zip(arg_names, args, strict=False)), **kwargs})
        except Exception:  # a grid function that needs what only Triton's launcher knows: say nothing
            return None
    try:
        return tuple(int(g) for g in grid)
    except (TypeError, ValueError):
        return None


class _Ops(TorchDispatchMode):
    """PyTorch ops that do work, outside Triton launches."""

    def __init__(self, found: list[Launch]):
        super().__init__()
        self.found = found
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if not self.paused and name not in NO_WORK_OPS:
            touched = _storages([*args, *kwargs.values(), *(out if isinstance(out, tuple | list) else [out])])
            self.found.append(Launch("torch", name, None, touched))
        return out


@contextlib.contextmanager
def record() -> Iterator[list[Launch]]:
    """The launches made inside the ``with`` block, in order."""
    found: list[Launch] = []
    ops = _Ops(found)

    def around(kernel, interpreted, launch, args, kwargs, grid, warmup):
        if not warmup:
            found.append(Launch("triton", getattr(kernel.fn, "__name__", "?"),
                                _grid(grid, list(kernel.arg_names), args, kwargs),
                                _storages([*args, *kwargs.values()])))
        ops.paused += 1  # what a launch does on the host (the interpreter's copies) is not the call's work
        try:
            return launch(*args, **kwargs)
        finally:
            ops.paused -= 1

    with launches_through(around), ops:
        yield found


PROFILED_CALLS = 5  # calls timed under the profiler: each launch shows its median over them
CALL_MARK = "grader.profile.call"  # the profiler's range around each timed call


@dataclass
class _TimedCall:
    """One call under the profiler: its GPU kernels (name, ms) in start order, and the PyTorch ops it ran on the
    host (``aten::`` events, whose device time counts every kernel they launched)."""

    kernels: list[tuple[str, float]]
    ops: list[Any]
    span_ms: float = 0.0  # first kernel's start to last kernel's end


def profile_call(name: str, call: Callable[[Any], Any], inputs: dict, *, device: str,
                 trace: Path | None = None, compiled: bool = False) -> CallProfile:
    """Warm ``call`` up on ``inputs``, then record the launches of one more call; on a GPU, time
    :data:`PROFILED_CALLS` more under ``torch.profiler``, each after the L2 cache is flushed (as ``grader bench``
    times a call: a kernel reads its inputs from memory, not from the cache the previous call left).

    ``compiled``: a ``torch.compile`` call, not recorded (under a dispatch mode it would run eagerly, op by op, and
    keep doing so): its launches are the kernels the profiler saw."""
    result = CallProfile(name)
    try:
        call(device_inputs(inputs, device))  # compiles and autotunes: not the call's own launches
        fresh = device_inputs(inputs, device)  # outside the recording: copying inputs is not the call's work
        if not compiled:
            with record() as found:
                call(fresh)
            result.launches = list(found)
        if device != "cuda":
            return result
        calls = _timed_calls(call, inputs, trace.with_name(f"{trace.stem}-{_slug(name)}{trace.suffix}")
                             if trace is not None else None)
        if not result.launches:  # launched past Triton's and PyTorch's dispatch (Inductor's own launcher): the GPU's
            result.launches = [Launch("kernel", kernel, None) for kernel, _ in calls[0].kernels]
        per_call = [_launch_times(result.launches, timed) for timed in calls]
        for i, launch in enumerate(result.launches):
            times = [ms[i] for ms in per_call if ms[i] is not None]
            launch.ms = statistics.median(times) if times else None
        result.gpu_ms = statistics.median(sum(ms for _, ms in timed.kernels) for timed in calls)
        result.span_ms = statistics.median(timed.span_ms for timed in calls)
    except Exception as exc:  # the student's call (or a baseline) failed: that is the candidate's result
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return result


def _timed_calls(call: Callable[[Any], Any], inputs: dict, trace: Path | None) -> list[_TimedCall]:
    """:data:`PROFILED_CALLS` calls under the profiler, each prepared as ``grader bench`` prepares a timed call: the
    L2 cache flushed, then the GPU held busy for longer than the call takes to launch (:func:`_hold_ms`), so that the
    whole call is queued before its first kernel starts and its kernels run as the GPU schedules them, not as the
    host's Python (slowed by the profiler) hands them over. Kernels on several streams then overlap as they do when
    ``grader bench`` times the call.

    The profiler lists every kernel of the run in start order; the preparation's own kernels (learnt by profiling a
    preparation alone) open each call's group, so a group is the preparation's kernels followed by the call's. A
    call's PyTorch ops are the ``aten::`` events inside its :data:`CALL_MARK` range."""
    from grader.speed.clocks import CudaClock

    clock = CudaClock()
    hold_ms = _hold_ms(call, inputs, clock)

    def prepare() -> None:
        clock.flush()
        clock.hold(hold_ms)

    prepare()
    clock.sync()
    with _profiler() as prof:
        prepare()
        clock.sync()
    per_prepare = len(_kernel_events(prof.events()))
    fresh = [device_inputs(inputs, "cuda") for _ in range(PROFILED_CALLS)]
    clock.sync()
    with _profiler() as prof:
        for values in fresh:
            prepare()
            with torch.profiler.record_function(CALL_MARK):
                call(values)
        clock.sync()
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    events = list(prof.events())
    kernel_events = _kernel_events(events)
    kernels = [(e.name, e.device_time / 1e3) for e in kernel_events]
    size = len(kernels) // PROFILED_CALLS
    if size * PROFILED_CALLS != len(kernels) or size <= per_prepare:
        raise RuntimeError(f"its {PROFILED_CALLS} profiled calls launched different kernels ({len(kernels)} in all): "
                           "a call that depends on the previous one cannot be profiled call by call")
    cpu = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CPU]
    marks = sorted((e for e in cpu if e.name == CALL_MARK), key=lambda e: e.time_range.start)
    ops = sorted((e for e in cpu if e.name.startswith("aten::")), key=lambda e: e.time_range.start)
    calls = []
    for i, mark in enumerate(marks[:PROFILED_CALLS]):
        mine = kernel_events[i * size + per_prepare:(i + 1) * size]
        span_ms = (max(e.time_range.end for e in mine) - min(e.time_range.start for e in mine)) / 1e3
        calls.append(_TimedCall(kernels[i * size + per_prepare:(i + 1) * size],
                                [e for e in ops if mark.time_range.start <= e.time_range.start <= mark.time_range.end],
                                span_ms))
    return calls


def _hold_ms(call: Callable[[Any], Any], inputs: dict, clock) -> float:
    """How long to hold the GPU before a profiled call: the timing engine's rule (:mod:`grader.speed.timing`) applied
    to the host time the call takes to launch under the profiler (which slows every launch)."""
    from grader.speed.timing import HOLD_MAX_MS, hold_ms

    launches = []
    with _profiler():
        for _ in range(3):
            values = device_inputs(inputs, "cuda")
            clock.flush()
            clock.hold(HOLD_MAX_MS)
            launched = clock.wall()
            call(values)
            launches.append((clock.wall() - launched) * 1e3)
            clock.sync()
    return min(HOLD_MAX_MS, hold_ms(statistics.median(launches)))


def _launch_times(launches: list[Launch], timed: _TimedCall) -> list[float | None]:
    """Each launch's GPU time in one timed call (None where it cannot be told):

    * a Triton launch: the next kernel of its name;
    * a PyTorch op: the next ``aten::`` event of its name that starts after the previous op's ended (so an op
      nested inside an earlier one is not taken for a later one), with every kernel it launched (a cuBLAS matmul
      may launch two);
    * a kernel seen only by the profiler: the kernel in the same position."""
    times: list[float | None] = []
    used: set[int] = set()
    cursor = float("-inf")
    for position, launch in enumerate(launches):
        ms = None
        if launch.kind == "triton":
            i = next((i for i, (name, _) in enumerate(timed.kernels) if name == launch.name and i not in used), None)
            if i is not None:
                used.add(i)
                ms = timed.kernels[i][1]
        elif launch.kind == "torch":
            op = next((e for e in timed.ops if e.name == f"aten::{launch.name}" and e.time_range.start >= cursor),
                      None)
            if op is not None:
                cursor = op.time_range.end
                ms = op.device_time_total / 1e3
        elif position < len(timed.kernels):
            ms = timed.kernels[position][1]
        times.append(ms)
    return times


def _profiler():
    # torch warns, once a process, that a profiler object keeps only its last cycle's events: each of ours runs once
    warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle", category=UserWarning)
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                              torch.profiler.ProfilerActivity.CUDA])


def _kernel_events(events) -> list[Any]:
    """The GPU kernels among the profiler's ``events``, in start order; the GPU's copy of a range mark is not a
    kernel."""
    found = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
             and e.device_time > 0 and e.name != CALL_MARK]
    found.sort(key=lambda e: e.time_range.start)
    return found


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")
