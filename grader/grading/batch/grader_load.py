"""``grader grade --profile``: the load on the grader's own process while a batch runs.

One process judges every exercise run of the batch, serves each GPU's turns and supervises every worker: its Python
runs one thread at a time (the GIL). Two figures tell how near that limit it is:

* its CPU time per kind of thread (judging, supervising workers, GPU turns, reading the workers' output, ...), from
  Linux's per-thread counters (``/proc/self/task``), sampled five times a second: what a thread used in its last
  0.2 s is not seen, and is given as "not attributed". Threads that Python did not start (torch's CPU thread pools,
  which run the judging's tensor arithmetic, CUDA's) are counted together, as :data:`NATIVE`;
* how late a thread that sleeps 5 ms wakes up to run Python again: near zero on an idle process; tens of milliseconds
  when many threads want the GIL at once, and then every judging thread and every GPU turn waits as long.
"""

from __future__ import annotations

import array
import os
import threading
import time

SAMPLE_S = 0.2  # about 1 % of a core with two hundred threads
TICK_S = 0.005

# a thread's name (its start) -> its kind, in the order tried
KINDS = (
    ("judge", "judging"),
    ("slot ", "exercise runs (planning, inputs, workers)"),
    ("part", "worker groups (inputs, workers)"),
    ("worker ", "workers' messages"),
    ("output reader", "workers' output"),
    ("memory watch", "memory watch"),
    ("process exit", "workers' exits"),
    ("gpu-", "GPU turns"),
    ("timer", "trusted timers"),
    ("count-benchmark", "counting the benchmarks' work"),
    ("MainThread", "main thread (progress, reports)"),
    ("grader-load", "this profile's sampling"),
)
OTHER = "other threads"
NATIVE = "threads outside Python (torch's CPU pools, CUDA's)"


def kind_of(name: str) -> str:
    return next((kind for prefix, kind in KINDS if name.startswith(prefix)), OTHER)


def _thread_ticks(tid: int) -> int | None:
    """User + system CPU clock ticks of thread ``tid`` of this process (None once it has ended, or off Linux)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of the line


def _threads() -> list[tuple[int, str]]:
    """This process's threads and their kinds: Python's by name, then the others (:data:`NATIVE`)."""
    threads = [(t.native_id, kind_of(t.name)) for t in threading.enumerate() if t.native_id is not None]
    known = {tid for tid, _ in threads}
    try:
        tids = [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:  # not Linux: Python's threads only
        return threads
    return threads + [(tid, NATIVE) for tid in tids if tid not in known]


def percentile(sorted_values, q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class GraderLoad:
    """Samples this process while it grades; :meth:`stop` ends it, :meth:`text` says what it saw."""

    def __init__(self) -> None:
        self._ticks_per_s = os.sysconf("SC_CLK_TCK")
        self._start: dict[int, int] = {}  # thread -> its ticks when sampling started (threads alive then)
        self._last: dict[int, tuple[str, int]] = {}  # thread -> (kind, its ticks when last seen)
        self._lags = array.array("f")  # seconds late, per wake-up
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> GraderLoad:
        for tid, _kind in _threads():
            ticks = _thread_ticks(tid)
            if ticks is not None:
                self._start[tid] = ticks
        self._threads = [threading.Thread(target=self._sample, name="grader-load sampler", daemon=True),
                         threading.Thread(target=self._tick, name="grader-load ticker", daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._look()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._look()

    def _look(self) -> None:
        for tid, kind in _threads():
            ticks = _thread_ticks(tid)
            if ticks is not None:
                self._last[tid] = (kind, ticks)

    def _tick(self) -> None:
        while not self._stop.is_set():
            before = time.monotonic()
            time.sleep(TICK_S)
            self._lags.append(max(0.0, time.monotonic() - before - TICK_S))

    def cpu_by_kind(self) -> dict[str, float]:
        """CPU seconds per kind of thread, since :meth:`start`."""
        seconds: dict[str, float] = {}
        for tid, (kind, ticks) in self._last.items():
            used = (ticks - self._start.get(tid, 0)) / self._ticks_per_s
            seconds[kind] = seconds.get(kind, 0.0) + max(0.0, used)
        return seconds

    def lags(self) -> list[float]:
        return sorted(self._lags)

    def text(self, own_cpu_s: float) -> str:
        """The profile's lines, given the process's CPU time over the same span (for what the samples missed)."""
        by_kind = sorted(self.cpu_by_kind().items(), key=lambda kv: -kv[1])
        seen = sum(s for _, s in by_kind)
        parts = [f"{kind} {s:.1f} s" for kind, s in by_kind if s >= 0.05]
        missed = own_cpu_s - seen
        if missed >= 0.05:
            parts.append(f"not attributed {missed:.1f} s (threads' last {SAMPLE_S:g} s)")
        lags = self.lags()
        ms = [1000 * percentile(lags, q) for q in (0.5, 0.95)] + [1000 * (lags[-1] if lags else 0.0)]
        return (f"  the grader's own CPU by thread: {', '.join(parts) or 'none'}\n"
                f"  a thread of the grader's waking from a {TICK_S * 1000:g} ms sleep ran Python again "
                f"{ms[0]:.1f} ms late (median), {ms[1]:.1f} ms (95th percentile), {ms[2]:.0f} ms at most "
                f"({len(lags)} wake-ups; late when the grader's threads queue for its one interpreter lock)")
