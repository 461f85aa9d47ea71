"""The launches of one call, recorded for ``grader profile`` (:mod:`.profile`): every Triton launch (its kernel,
grid and the tensors it is handed) and every PyTorch op that does work, and on a GPU each one's time from
``torch.profiler``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grader.checks.execute import device_inputs
from grader.checks.integrity import launches_through, tensors_in
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
    gpu_ms: float | None = None  # every kernel of the call, on a GPU


def _storages(values) -> dict[int, int]:
    """Storage address -> bytes of the tensors among ``values``."""
    found = {}
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


def _gpu_times(launches: list[Launch], kernels: list[tuple[str, float]]) -> None:
    """Give each launch the GPU time of its kernel, from the profiler's kernels in launch order: a Triton launch
    takes the next kernel of its name; a PyTorch op the next kernel that is no Triton launch's (an op that launches
    several shows the first; the total counts them all)."""
    triton_names = {launch.name for launch in launches if launch.kind == "triton"}
    taken = [False] * len(kernels)
    for launch in launches:
        for i, (name, ms) in enumerate(kernels):
            mine = name == launch.name if launch.kind != "torch" else name not in triton_names
            if not taken[i] and mine:
                taken[i], launch.ms = True, ms
                break


def profile_call(name: str, call: Callable[[Any], Any], inputs: dict, *, device: str,
                 trace: Path | None = None) -> CallProfile:
    """Warm ``call`` up on ``inputs``, then record the launches of one more call (timed on a GPU)."""
    result = CallProfile(name)
    try:
        call(device_inputs(inputs, device))  # compiles and autotunes: not the call's own launches
        fresh = device_inputs(inputs, device)
        if device != "cuda":
            with record() as found:
                call(fresh)
            result.launches = list(found)
            return result
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof, record() as found:
            call(fresh)
            torch.cuda.synchronize()
        result.launches = list(found)
        kernels = [(e.name, e.device_time / 1e3) for e in prof.events()
                   if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and e.device_time > 0]
        if not result.launches:  # launched past Triton's and PyTorch's dispatch (Inductor's own launcher): the GPU's
            result.launches = [Launch("kernel", name, None, ms=ms) for name, ms in kernels]
        _gpu_times(result.launches, kernels)
        result.gpu_ms = sum(ms for _, ms in kernels)
        if trace is not None:
            prof.export_chrome_trace(str(trace.with_name(f"{trace.stem}-{_slug(name)}{trace.suffix}")))
    except Exception as exc:  # the student's call (or a baseline) failed: that is the candidate's result
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return result


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")
