"""Threads standing in for the processes that share a GPU: each gets a real :class:`~grader.checks.gpu_gate.Gate`
over real pipes to a real :class:`~grader.grading.isolation.gpu_arbiter.GpuArbiter`."""

from __future__ import annotations

import contextlib
import os

from grader.checks.gpu_gate import Gate
from grader.grading.isolation.gpu_arbiter import Client, GpuArbiter


class ThreadProcess:
    """A process's gate, used from threads of this one; :meth:`die` closes its ends as a process's exit would."""

    def __init__(self, arbiter: GpuArbiter, name: str = "process", role: str = "worker"):
        self.client: Client = arbiter.connect(name, role=role)
        self._fds = [os.dup(fd) for fd in self.client.process_fds]
        self.client.started()  # closes the arbiter's copies of the process's ends, as after a real start
        self.gate = Gate(*self._fds)

    def die(self) -> None:
        """Gone, as a process at its exit: the arbiter forgets it and closes its end (as the grader does when a
        worker has ended), so the gate's listener reads the end and stops; then our descriptors close. Not before:
        a listener still blocked in a read would next read from whatever pipe of another gate reuses a closed
        descriptor's number (a real process takes its descriptors with it). A listener that does not stop (its
        process is stuck inside ``use()``) keeps them."""
        self.client.close()
        self.gate.listener.join(timeout=2)
        if not self.gate.listener.is_alive():
            for fd in self._fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
