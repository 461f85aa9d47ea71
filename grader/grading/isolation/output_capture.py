"""What an untrusted process printed: its stdout and stderr drained by a thread each, the first ``cap`` bytes of each
kept and the rest counted and dropped, so that printing never blocks or kills the student's run; and its stdin fed
by a thread of its own.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass


@dataclass
class Captured:
    """What a process wrote to one pipe: the bytes kept, and how many it wrote."""

    data: bytes
    total: int  # bytes the process wrote, kept or not

    @property
    def dropped(self) -> int:
        return self.total - len(self.data)

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[... {self.dropped} more bytes of output not kept]"
        return text


class OutputReader(threading.Thread):
    """Drain a pipe, keeping the first ``cap`` bytes."""

    def __init__(self, stream, cap: int):
        super().__init__(name="output reader", daemon=True)
        self.stream, self.cap = stream, cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.total = 0

    def run(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := self.stream.read1(1 << 16):
                self.total += len(chunk)
                if self.kept < self.cap:
                    piece = chunk[: self.cap - self.kept]
                    self.chunks.append(piece)
                    self.kept += len(piece)
        with contextlib.suppress(OSError, ValueError):
            self.stream.close()  # here, not in stop(): closing a stream another thread reads blocks

    def captured(self) -> Captured:
        return Captured(b"".join(self.chunks), self.total)


def feed(stream, data: bytes) -> None:
    """Write ``data`` to a process's stdin and close it; a process that exits first is not an error."""
    with contextlib.suppress(OSError, ValueError):
        stream.write(data)
        stream.close()
