"""The primitives timing goes through, captured before student code can replace them.

In the student's worker, :func:`capture_primitives` records, before any student module is imported, every callable
that timing goes through (CUDA events, synchronization, ``time.perf_counter``, ``do_bench``, the timing modules' own
functions, the statistics), and :func:`tampered` names whatever was replaced or rewritten since: the grader turns a
non-empty answer into the integrity flag ``timer-tampering``, and checks every time against the GPU's physical
limits in its own process (:mod:`grader.speed.gpu_limits`). :class:`~grader.speed.clocks.CudaClock` uses the captured
objects (:func:`grader.speed.primitives.primitive`).
"""

from __future__ import annotations

import builtins
import statistics
import sys
import time
from typing import Any

from grader.speed.primitives import CAPTURED

_MISSING = object()


def _code(value: Any) -> Any:
    """The code object behind a function, method, property or class/static method (None for C callables)."""
    for inner in (value, getattr(value, "fget", None), getattr(value, "__func__", None)):
        code = getattr(inner, "__code__", None)
        if code is not None:
            return code
    return None


def _targets() -> dict[str, tuple[Any, str]]:
    """Everything a measurement calls: name -> (owner, attribute)."""
    import torch
    import triton.testing

    from grader.speed import clocks, measure, primitives, stats, student_calls, timing

    this = sys.modules[__name__]
    found: dict[str, tuple[Any, str]] = {
        "time.perf_counter": (time, "perf_counter"), "time.monotonic": (time, "monotonic"), "time.time": (time, "time"),
        "torch.cuda.Event": (torch.cuda, "Event"), "torch.cuda.synchronize": (torch.cuda, "synchronize"),
        "torch.cuda._sleep": (torch.cuda, "_sleep"), "torch.cuda.current_stream": (torch.cuda, "current_stream"),
        "torch.cuda.CUDAGraph": (torch.cuda, "CUDAGraph"), "torch.cuda.graph": (torch.cuda, "graph"),
        "triton.testing.do_bench": (triton.testing, "do_bench"),
    }
    owners = {"torch.cuda.Event": torch.cuda.Event, "torch.cuda.CUDAGraph": torch.cuda.CUDAGraph,
              "torch._C._CudaEventBase": torch._C._CudaEventBase}
    for owner_name, owner in owners.items():
        for attr in ("record", "elapsed_time", "synchronize", "query", "replay", "__init__", "__new__"):
            if attr in vars(owner):
                found[f"{owner_name}.{attr}"] = (owner, attr)
    for attr in ("median", "fmean", "stdev"):
        found[f"statistics.{attr}"] = (statistics, attr)
    for attr in ("sorted", "min", "max", "sum", "len", "float", "int", "isinstance"):
        found[f"builtins.{attr}"] = (builtins, attr)
    for module in (timing, stats, clocks, this, measure, student_calls, primitives):
        prefix = module.__name__
        for attr, value in vars(module).items():
            if getattr(value, "__module__", None) == module.__name__ and (callable(value) or isinstance(value, type)):
                found[f"{prefix}.{attr}"] = (module, attr)
                if isinstance(value, type):
                    for member in vars(value):
                        if _code(vars(value)[member]) is not None:
                            found[f"{prefix}.{attr}.{member}"] = (value, member)
    return found


def capture_primitives() -> None:
    """Record the timing primitives as they are now. The grader's worker calls this before it imports
    any student module; :class:`CudaClock` then uses these objects and :func:`tampered` compares."""
    CAPTURED.clear()
    for name, (owner, attr) in _targets().items():
        value = vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)
        CAPTURED[name] = (owner, attr, value, _code(value))


def tampered() -> list[str]:
    """The captured primitives that were replaced, deleted or had their code rewritten since
    :func:`capture_primitives` (empty where nothing was captured)."""
    changed = []
    for name, (owner, attr, value, code) in CAPTURED.items():
        now = vars(owner).get(attr, _MISSING) if isinstance(owner, type) else getattr(owner, attr, _MISSING)
        if now is not value or _code(now) is not code:
            changed.append(name)
    return changed
