"""Progress of a batch on stderr: a rich progress bar on a terminal; one plain line per finished task
otherwise (logs stay readable). Both say what is done, running and left, the batch's time per submission and
when it should end.

The estimate weighs the tasks by their work, not their number: the batch runs its longest tasks first and several
at once, so the tasks finished early are the long ones, and each finishes with the others well under way. Each
task is counted at its expected length: the median of its exercise's finished runs, else its planned estimate
scaled by how the finished runs compared with theirs. The work done is the finished runs plus the running ones'
time so far (at most their expected length); the wall time per second of work done so far gives the end.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """``work``: each task's key (``"<student> <exercise>"``) with its exercise and planned seconds; without it,
    every task counts alike."""

    def __init__(self, total: int, description: str, *, per_submission: int = 1,
                 work: Mapping[str, tuple[str, float]] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.total, self.done, self.running = total, 0, 0
        self.per_submission = max(1, per_submission)  # tasks per submission: the exercises graded
        self._clock = clock
        self.started = clock()
        self._work = dict(work or {})  # the tasks not finished
        self._weighted = bool(self._work)
        self._since: dict[str, float] = {}  # running tasks: when each started
        self._took: dict[str, list[float]] = {}  # finished tasks' times, by exercise
        self._scale: list[float] = []  # finished tasks: their time over their planned time
        self._left: dict[str, list[float]] = {}  # tasks not finished, by exercise: [how many, planned seconds]
        for exercise, planned in self._work.values():
            count_planned = self._left.setdefault(exercise, [0, 0.0])
            count_planned[0] += 1
            count_planned[1] += planned
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
        """``running 3 · left 12 · 41 s per submission · ends in about 8 min``: the batch's expected wall time per
        submission, and what is left of it (see the module's docstring)."""
        left = self.total - self.done - self.running
        text = f"running {self.running} · left {left}"
        if self.done:
            elapsed = self._clock() - self.started
            remaining = self._remaining(elapsed)
            submissions = self.total / self.per_submission
            text += f" · {_duration((elapsed + remaining) / submissions)} per submission"
            if self.done < self.total:
                text += f" · ends in about {_duration(remaining)}"
        return text

    def _remaining(self, elapsed: float) -> float:
        """Wall seconds left: the work left (in seconds of runs) at the batch's wall time per second of work so far.
        Computed per exercise, not per task: it runs at every line, and a class may have thousands of tasks."""
        if not self._weighted:  # every task alike
            return elapsed / self.done * (self.total - self.done)
        medians = {exercise: statistics.median(times) for exercise, times in self._took.items()}
        factor = self._factor()
        now = self._clock()
        under_way = sum(min(now - since, self._expected(key, medians, factor)) for key, since in self._since.items())
        progress = sum(sum(times) for times in self._took.values()) + under_way
        left = sum(medians[exercise] * count if exercise in medians else planned * factor
                   for exercise, (count, planned) in self._left.items()) - under_way
        return elapsed * max(0.0, left) / progress if progress > 0 else 0.0

    def _factor(self) -> float:
        """How long the finished tasks took against their plans (the median ratio; 1 before any finished)."""
        return statistics.median(self._scale) if self._scale else 1.0

    def _expected(self, key: str, medians: Mapping[str, float], factor: float) -> float:
        """A task's expected seconds: its exercise's median so far, else its plan scaled as the finished ran."""
        exercise, planned = self._work.get(key, ("", 0.0))
        return medians.get(exercise, planned * factor)

    def start(self, key: str | None = None) -> None:
        with self._lock:
            self.running += 1
            if key is not None:
                self._since[key] = self._clock()
            self._refresh()

    def advance(self, message: str, *, key: str | None = None, took_s: float | None = None) -> None:
        """A task finished (``key``, in ``took_s``: from its start where this process saw it start)."""
        with self._lock:
            self.done += 1
            self.running = max(0, self.running - 1)
            if key is not None and key in self._work:
                self._finished(key, took_s)
            if self.bar is not None:
                self.bar.console.log(message, markup=False, highlight=False, emoji=False)  # as written
                self.bar.advance(self.task)
                self._refresh()
            else:
                print(f"[{self.done}/{self.total}] {message} ({self.status()})", file=sys.stderr, flush=True)

    def _finished(self, key: str, took_s: float | None) -> None:
        since = self._since.pop(key, None)
        exercise, planned = self._work.pop(key)  # counted once
        took = took_s
        if took is None and since is not None:
            took = self._clock() - since
        if took is None:  # neither its time nor its start is known: as expected
            took = statistics.median(self._took[exercise]) if exercise in self._took else planned * self._factor()
        self._took.setdefault(exercise, []).append(max(0.0, took))
        if planned > 0:
            self._scale.append(max(0.0, took) / planned)
        count_planned = self._left[exercise]
        count_planned[0] -= 1
        count_planned[1] -= planned
        if count_planned[0] <= 0:
            del self._left[exercise]

    def wall(self) -> float:
        """Seconds since the batch's runs started."""
        return self._clock() - self.started

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
