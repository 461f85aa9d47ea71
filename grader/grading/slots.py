"""Where an exercise run happens: a :class:`Slot` is one CPU worker place or one GPU, with the environment
that pins a worker to it and a :class:`SharedExclusiveLock` that exercise runs sharing the GPU take —
shared around correctness items (several may run at once), exclusive around speed items (a timed
measurement has the GPU to itself).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


class SharedExclusiveLock:
    """A reader-writer lock that prefers writers: once ``exclusive()`` is waiting, no new ``shared()``
    holder enters, so a speed measurement is never starved by a stream of correctness checks."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._writers_waiting = 0
        self.alone_s = 0.0  # seconds it was held exclusively (grader grade --profile)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._writers_waiting:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                if self._shared == 0:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._exclusive or self._shared:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._exclusive = True
        since = time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self.alone_s += time.monotonic() - since
                self._cond.notify_all()

    @property
    def holders(self) -> tuple[int, bool]:
        """(shared holders, exclusive held): for tests and diagnostics."""
        with self._cond:
            return self._shared, self._exclusive


@dataclass
class Slot:
    """One place to run exercises: ``cpu-0`` or ``cuda:2``. ``capacity`` exercise runs may use it at once
    (their timed items still hold it alone, through ``lock``)."""

    name: str
    device: Mapping[str, Any]  # recorded in every result: {"kind", "name", "index", "uuid"}
    env: Mapping[str, str] = field(default_factory=dict)  # the worker's pinning (CUDA_VISIBLE_DEVICES)
    gpu_name: str | None = None
    capacity: int = 1
    lock: SharedExclusiveLock = field(default_factory=SharedExclusiveLock)
    failed: str | None = None  # why it was taken out of the pool

    @property
    def is_gpu(self) -> bool:
        return self.device.get("kind") == "cuda"

    def describe(self) -> str:
        if not self.is_gpu:
            return self.name
        uuid = self.device.get("uuid")
        return f"{self.name} ({self.device.get('name', '?')}{', ' + str(uuid) if uuid else ''})"
