"""Progress of a batch on stderr: a rich progress bar on a terminal; one plain line per finished task
otherwise (logs stay readable). Both say what is done, running and left, the time per submission so far and
when the batch should end."""

from __future__ import annotations

import sys
import threading
import time


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    def __init__(self, total: int, description: str, *, per_submission: int = 1):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.total, self.done, self.running = total, 0, 0
        self.per_submission = max(1, per_submission)  # tasks per submission: the exercises graded
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self.bar = None
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("{task.fields[status]}"), console=self.console, transient=False)
            self.task = self.bar.add_task(description, total=total, status="")
            self.bar.start()
        else:
            print(description, file=sys.stderr, flush=True)

    def status(self) -> str:
        """``running 3 · left 12 · 41 s per submission · ends in about 8 min``: the rate is the batch's wall
        time so far per submission's worth of finished tasks."""
        left = self.total - self.done - self.running
        text = f"running {self.running} · left {left}"
        if self.done:
            elapsed = time.monotonic() - self.started
            per_task = elapsed / self.done
            text += f" · {_duration(per_task * self.per_submission)} per submission"
            if self.done < self.total:
                text += f" · ends in about {_duration(per_task * (self.total - self.done))}"
        return text

    def start(self) -> None:
        with self._lock:
            self.running += 1
            self._refresh()

    def advance(self, message: str) -> None:
        with self._lock:
            self.done += 1
            self.running = max(0, self.running - 1)
            if self.bar is not None:
                self.bar.console.log(message, markup=False, highlight=False, emoji=False)  # as written
                self.bar.advance(self.task)
                self._refresh()
            else:
                print(f"[{self.done}/{self.total}] {message} ({self.status()})", file=sys.stderr, flush=True)

    def wall(self) -> float:
        """Seconds since the batch's runs started."""
        return time.monotonic() - self.started

    def set_running(self, running: int) -> None:
        """The runs under way, where another process runs them (a split batch's children)."""
        with self._lock:
            if running != self.running:
                self.running = running
                self._refresh()

    def _refresh(self) -> None:
        if self.bar is not None:
            self.bar.update(self.task, status=self.status())

    def note(self, message: str) -> None:
        if self.bar is not None:
            self.bar.console.log(message, markup=False, highlight=False, emoji=False)
        else:
            print(message, file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
