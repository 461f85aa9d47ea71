"""Threads standing in for the processes that share a GPU: each gets a real :class:`~grader.checks.gpu_gate.Gate`
over real pipes to a real :class:`~grader.grading.isolation.gpu_arbiter.GpuArbiter`, on the arbiter's clock. And
how a test waits for another thread to get somewhere: by what it can see, never by sleeping a while."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

from grader.checks.gpu_gate import Gate
from grader.grading.isolation.gpu_arbiter import HURRY_AFTER_S, Client, GpuArbiter
from tests.manual_clock import ManualClock

HANG_S = 30.0  # a wait this long means a hang: no test's outcome depends on how fast the machine runs
LOOK_S = 0.002  # how often until() looks


def until(condition: Callable[[], object], what: str, timeout_s: float = HANG_S, *, look_s: float = LOOK_S) -> None:
    """Return once ``condition()`` holds, looking every ``look_s``; fail after ``timeout_s`` (``what`` says what
    never happened)."""
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"after {timeout_s:g} s: {what}")
        time.sleep(look_s)


def waiting_in(cond: threading.Condition) -> int:
    """How many threads wait in ``cond.wait()`` now (CPython keeps them in ``_waiters``)."""
    return len(cond._waiters)  # type: ignore[attr-defined]


class ThreadProcess:
    """A process's gate, used from threads of this one; :meth:`die` closes its ends as a process's exit would."""

    def __init__(self, arbiter: GpuArbiter, name: str = "process", role: str = "worker"):
        self.client: Client = arbiter.connect(name, role=role)
        self._fds = [os.dup(fd) for fd in self.client.process_fds]
        self.client.started()  # closes the arbiter's copies of the process's ends, as after a real start
        self.gate = Gate(*self._fds, clock=arbiter.clock)

    def paused_and_waiting(self) -> bool:
        """Has the arbiter heard that a thread of this process waits to use the GPU while it is paused?"""
        return self.client._wants_since is not None

    def die(self) -> None:
        """Gone, as a process at its exit: :meth:`killed`, then :meth:`reaped`."""
        self.killed()
        self.reaped()

    def killed(self) -> None:
        """The arbiter forgets it and closes its end (as the grader does when a worker has ended), so the gate's
        listener reads the end and stops."""
        self.client.close()

    def reaped(self) -> None:
        """Our descriptors close once the listener has stopped. Not before: a listener still blocked in a read would
        next read from whatever pipe of another gate reuses a closed descriptor's number (a real process takes its
        descriptors with it). A listener that does not stop (its process is stuck inside ``use()``) keeps them."""
        self.gate.listener.join(timeout=2)
        if not self.gate.listener.is_alive():
            for fd in self._fds:
                with contextlib.suppress(OSError):
                    os.close(fd)


def asked_turns(arbiter: GpuArbiter) -> int:
    """Turns asked for that have not begun."""
    return len(arbiter._queue)


def drain_waits_for(clock: ManualClock, process: ThreadProcess) -> None:
    """See the arbiter wait for ``process`` to pause before a turn, and wait on once ``clock`` is past the moment
    it hurries those with GPU work in flight: the process's stretch holds the turn up. The clock moves on by
    ``2 * HURRY_AFTER_S``."""
    drained, name = process.client.drained, process.client.name
    until(lambda: clock.deadline_of(drained) is not None, f"a turn waits for {name} to pause")
    clock.advance(2 * HURRY_AFTER_S)
    until(lambda: (clock.deadline_of(drained) or 0.0) > clock.now(), f"a turn still waits for {name} once hurried")


@contextlib.contextmanager
def turn_held(process: ThreadProcess) -> Iterator[None]:
    """A thread of ``process`` holds the GPU alone: granted when the block starts, ended when the block ends."""
    granted, end = threading.Event(), threading.Event()

    def hold() -> None:
        with process.gate.alone():
            granted.set()
            end.wait(HANG_S)

    holder = threading.Thread(target=hold)
    holder.start()
    assert granted.wait(HANG_S), f"{process.client.name} is never granted the GPU alone"
    try:
        yield
    finally:
        end.set()
        holder.join(HANG_S)
