"""A :class:`grader.checks.host_clock.HostClock` for tests: its time moves only when the test calls
:meth:`ManualClock.advance`, so the durations the GPU's arbiter and gates record are exactly what the test
advanced, however fast or loaded the machine."""

from __future__ import annotations

import threading

POLL_S = 0.002  # how often a wait looks at its event (setting one says nothing to this clock)


class ManualClock:
    """Time stands still until :meth:`advance`; :meth:`wait_until` returns once its event is set or an advance
    has reached its deadline, and :meth:`deadline_of` says which events threads wait for now (the point a test
    lets the clock move on from)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._cond = threading.Condition()
        self._waits: list[tuple[threading.Event, float]] = []

    def now(self) -> float:
        with self._cond:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._cond:
            self._now += seconds
            self._cond.notify_all()

    def wait_until(self, event: threading.Event, deadline: float) -> bool:
        wait = (event, deadline)
        with self._cond:
            self._waits.append(wait)
            try:
                while not event.is_set() and self._now < deadline:
                    self._cond.wait(POLL_S)
            finally:
                self._waits.remove(wait)
            return event.is_set()

    def deadline_of(self, event: threading.Event) -> float | None:
        """The latest deadline of the waits for ``event`` under way, or None if no thread waits for it."""
        with self._cond:
            return max((deadline for waited, deadline in self._waits if waited is event), default=None)
