"""Clocks: what the timing engine needs from a device (:class:`Clock`) and the CUDA one (:class:`CudaClock`). The
tests' ``FakeClock`` (tests/fake_clock.py) is a deterministic stand-in."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any, Protocol

from grader.speed.primitives import primitive


class Clock(Protocol):
    """What the engine needs from a device: flush caches, timestamps in stream order, a host
    clock for the budget, and (optionally) graph capture."""

    def flush(self) -> None: ...

    def hold(self, ms: float) -> None: ...

    def mark(self) -> Any: ...

    def elapsed_ms(self, start: Any, end: Any) -> float: ...

    def sync(self) -> None: ...

    def wall(self) -> float: ...

    def capture(self, fn: Callable[[], Any]) -> Callable[[], None] | None: ...


class CudaClock:
    """CUDA events on the current stream; L2 flushed by zeroing Triton's 256 MB benchmark buffer
    (larger than the L2 of an H100/H200, 50/60 MB); the GPU held with ``torch.cuda._sleep``, a spin
    of a given number of clock cycles. Uses the primitives :func:`capture_primitives` recorded, where
    it was called."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._event = primitive("torch.cuda.Event", torch.cuda.Event)
        self._record = primitive("torch.cuda.Event.record", torch.cuda.Event.record)
        self._elapsed = primitive("torch.cuda.Event.elapsed_time", torch.cuda.Event.elapsed_time)
        self._synchronize = primitive("torch.cuda.synchronize", torch.cuda.synchronize)
        self._sleep = primitive("torch.cuda._sleep", torch.cuda._sleep)
        self._perf_counter = primitive("time.perf_counter", time.perf_counter)
        # cycles per ms at the highest clock (kHz; 2.1 GHz where torch does not say, above any data-centre
        # GPU's boost clock): a hold is never shorter than asked, only longer at a lower clock
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self._cycles_per_ms = getattr(props, "clock_rate", 0) or 2_100_000
        try:
            import triton

            driver = triton.runtime.driver.active
            self._cache = driver.get_empty_cache_for_benchmark()
            self._clear = getattr(driver, "clear_cache", None) or (lambda buf: buf.zero_())
        except (ImportError, AttributeError, RuntimeError):  # an older/other Triton: same buffer by hand
            self._cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
            self._clear = lambda buf: buf.zero_()

    def flush(self) -> None:
        self._clear(self._cache)

    def hold(self, ms: float) -> None:
        if ms > 0:
            self._sleep(int(ms * self._cycles_per_ms))

    def mark(self) -> Any:
        event = self._event(enable_timing=True)
        self._record(event)
        return event

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return self._elapsed(start, end)

    def sync(self) -> None:
        self._synchronize()

    def wall(self) -> float:
        return self._perf_counter()

    def capture(self, fn: Callable[[], Any]) -> Callable[[], None] | None:
        """A CUDA graph of one call of ``fn``; None if the call cannot be captured (it syncs,
        reads a value on the host, ...)."""
        torch = self._torch
        graph = torch.cuda.CUDAGraph()
        # A Triton kernel finalized by the cyclic GC during capture would unload its module and
        # invalidate the graph (triton.testing.cuda_graph_without_gc).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph):
                fn()
        except Exception:
            torch.cuda.synchronize()
            return None
        finally:
            if gc_was_enabled:
                gc.enable()
        return graph.replay
