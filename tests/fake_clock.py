"""A deterministic :class:`grader.speed.clocks.Clock` for the timing engine's tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class FakeClock:
    """A deterministic clock for tests: time only moves when a candidate calls :meth:`advance`
    (and by ``flush_ms`` per flush), and wall time is device time. ``capture`` returns a replay
    that calls ``fn`` with launch overhead removed: ``graph_speedup_ms`` is subtracted from what
    ``fn`` advanced; ``capture_fails`` makes capture fail."""

    def __init__(self, *, flush_ms: float = 0.0, graph_speedup_ms: float = 0.0, capture_fails: bool = False):
        self.now_ms = 0.0
        self.flush_ms = flush_ms
        self.graph_speedup_ms = graph_speedup_ms
        self.capture_fails = capture_fails
        self.flushes = 0
        self.syncs = 0
        self.captures = 0
        self.holds: list[float] = []

    def advance(self, ms: float) -> None:
        self.now_ms += ms

    def flush(self) -> None:
        self.flushes += 1
        self.now_ms += self.flush_ms

    def hold(self, ms: float) -> None:
        self.holds.append(ms)  # device time that passes before the start mark: never measured

    def mark(self) -> float:
        return self.now_ms

    def elapsed_ms(self, start: float, end: float) -> float:
        return end - start

    def sync(self) -> None:
        self.syncs += 1

    def wall(self) -> float:
        return self.now_ms / 1000.0

    def capture(self, fn: Callable[[], Any]) -> Callable[[], None] | None:
        if self.capture_fails:
            return None
        self.captures += 1

        def replay() -> None:
            start = self.now_ms
            fn()
            self.now_ms = max(start, self.now_ms - self.graph_speedup_ms)

        return replay
