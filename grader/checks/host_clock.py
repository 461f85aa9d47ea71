"""The host's clock as the code that shares a GPU (:mod:`grader.checks.gpu_gate`,
:mod:`grader.grading.isolation.gpu_arbiter`) reads it and waits on it: :data:`MONOTONIC` in the grader. Tests pass
a clock whose time moves only when they say, so that they check the order of events and the durations they made,
never how fast the machine ran."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class HostClock(Protocol):
    """Seconds on a monotonic clock, and a wait for an event bounded by a moment on it."""

    def now(self) -> float: ...

    def wait_until(self, event: threading.Event, deadline: float) -> bool:
        """Wait until ``event`` is set or this clock reaches ``deadline``; whether ``event`` is set."""
        ...


class MonotonicClock:
    """:func:`time.monotonic`, and :meth:`threading.Event.wait` for the seconds left."""

    def now(self) -> float:
        return time.monotonic()

    def wait_until(self, event: threading.Event, deadline: float) -> bool:
        return event.wait(max(0.0, deadline - time.monotonic()))


MONOTONIC = MonotonicClock()
