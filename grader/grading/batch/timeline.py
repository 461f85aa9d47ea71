"""``grader grade --profile``: the batch in windows of its wall time — the exercise runs in flight (by exercise), the
host's CPU busy, and how much of each window each GPU was held alone — so that its phases show: the long runs'
compilations filling the cores, their trusted timers' turns holding the GPU alone while the others wait, a tail of
short runs with the cores half idle."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from grader.grading.exercise_run.slots import Slot

SAMPLE_S = 1.0  # the host's CPU, read once a second
WINDOWS = 15  # about this many lines, whatever the batch's length
MIN_WINDOW_S = 10.0


def host_cpu() -> tuple[float, float] | None:
    """(busy, total) CPU time of the whole host so far, in clock ticks (Linux's /proc/stat; None elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            fields = [float(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


@dataclass(frozen=True)
class Span:
    start: float  # seconds since the batch started
    end: float


def window_s(wall: float) -> float:
    """A window's width: about :data:`WINDOWS` of them in ``wall``, a multiple of 10 s, at least
    :data:`MIN_WINDOW_S`."""
    return max(MIN_WINDOW_S, 10.0 * math.ceil(wall / WINDOWS / 10.0))


def overlap(span: Span, lo: float, hi: float) -> float:
    return max(0.0, min(span.end, hi) - max(span.start, lo))


class Timeline:
    """Records the batch's runs (:meth:`ran`) and samples the host's CPU from :meth:`start` to :meth:`stop`;
    :meth:`text` lays them out with each GPU's turns alone (:attr:`GpuArbiter.turns`)."""

    def __init__(self, started: float) -> None:
        self.started = started  # time.monotonic() when the batch's runs started
        self.runs: list[tuple[Span, str]] = []  # (when, exercise)
        self.cpu: list[tuple[float, float]] = []  # (seconds since the start, the share busy in the second before)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="grader-load timeline", daemon=True)

    def start(self) -> Timeline:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def ran(self, exercise: str, start: float, end: float) -> None:
        """An exercise run of the batch, from ``start`` to ``end`` (``time.monotonic()``)."""
        with self._lock:
            self.runs.append((Span(start - self.started, end - self.started), exercise))

    def _sample(self) -> None:
        before = host_cpu()
        while not self._stop.wait(SAMPLE_S):
            now = host_cpu()
            if before is not None and now is not None and now[1] > before[1]:
                with self._lock:
                    self.cpu.append((time.monotonic() - self.started, (now[0] - before[0]) / (now[1] - before[1])))
            before = now

    def text(self, slots: Sequence[Slot], wall: float) -> str:
        """The profile's lines: a line per window of the batch's ``wall`` seconds."""
        with self._lock:
            runs, cpu = list(self.runs), list(self.cpu)
        gpus = [(slot.name, [Span(a - self.started, b - self.started) for a, b in list(slot.arbiter.turns)])
                for slot in slots if slot.is_gpu and slot.arbiter is not None]
        return layout(runs, cpu, gpus, wall)


def layout(runs: Sequence[tuple[Span, str]], cpu: Sequence[tuple[float, float]],
           gpus: Sequence[tuple[str, Sequence[Span]]], wall: float) -> str:
    """The lines of :meth:`Timeline.text`, from the runs, the CPU samples and each GPU's turns alone (seconds since
    the batch started)."""
    width = window_s(wall)
    what = "exercise runs in flight, the host's CPU busy" + "".join(f", {name} held alone" for name, _ in gpus)
    lines = [f"  the batch every {width:.0f} s: {what}"]
    lo = 0.0
    while lo < wall:
        hi = lo + width
        flying = Counter(exercise for span, exercise in runs if span.start < hi and span.end > lo)
        busy = [share for at, share in cpu if lo < at <= hi]
        names = ", ".join(f"{exercise} {count}" for exercise, count in sorted(flying.items(), key=lambda kv: -kv[1]))
        when = f"{lo:.0f}–{min(hi, wall):.0f} s"
        line = f"    {when:>12}: {sum(flying.values())} run(s)"
        line += f" ({names})" if names else ""
        line += f", CPU {100 * sum(busy) / len(busy):.0f} %" if busy else ", CPU ?"
        for name, turns in gpus:
            held = sum(overlap(turn, lo, hi) for turn in turns)
            line += f", {name} alone {100 * held / (min(hi, wall) - lo):.0f} %"
        lines.append(line)
        lo = hi
    return "\n".join(lines)
