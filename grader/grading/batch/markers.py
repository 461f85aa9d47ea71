"""A task's "running" marker (``OUT/staff/running/<id>/<exercise>.json``, :mod:`grader.grading.results.store`):
written when the task starts, touched every :data:`HEARTBEAT_S` while it runs, removed once its result is
committed. It says who runs the task: host, boot, pid and the pid's start time, the Slurm job, the batch.

A marker is trusted only while that is still true. On the same host (and boot) the process must still
exist with the same start time — a SIGKILLed grader's markers are stale at once. Elsewhere, a marker whose
Slurm job has left the queue is stale, and so is one without a heartbeat for :data:`STALE_S` seconds.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEARTBEAT_S = 30.0
STALE_S = 300.0
_LIVE_BATCHES: set[str] = set()  # the batches this process is running now


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a pid from a later one that reuses it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return fields[19].decode()


def slurm_job() -> str | None:
    """This process's Slurm job as squeue names it (``123_4`` for an array task), if it runs in one."""
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and index:
        return f"{array}_{index}"
    return os.environ.get("SLURM_JOB_ID") or None


def mine(*, slot: str, batch: str) -> dict[str, Any]:
    return {"host": socket.gethostname(), "boot": _boot_id(), "pid": os.getpid(),
            "pid_start": process_start(os.getpid()), "job": slurm_job(), "slot": slot, "batch": batch,
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}


@dataclass(frozen=True)
class Liveness:
    alive: bool
    why: str  # "pid 123 on host" / "pid 123 on host is gone" / ...
    same_host: bool


def liveness(data: dict[str, Any], age_s: float, active_jobs: set[str] | None = None) -> Liveness:
    """Is the task this marker describes still running? ``active_jobs``: the Slurm jobs still queued or
    running (None where squeue cannot be asked)."""
    host, pid = data.get("host", "?"), data.get("pid")
    where = f"pid {pid} on {host}" + (f", Slurm job {data['job']}" if data.get("job") else "")
    same_host = host == socket.gethostname() and data.get("boot") == _boot_id()
    if same_host and pid == os.getpid():  # this process: alive only while the batch that wrote it runs
        alive = data.get("batch") in _LIVE_BATCHES
        return Liveness(alive, where if alive else f"{where}: that batch has ended", True)
    if same_host:
        alive = isinstance(pid, int) and process_start(pid) == data.get("pid_start")
        return Liveness(alive, where if alive else f"{where}: that process is gone", True)
    if data.get("job") and active_jobs is not None:
        alive = str(data["job"]) in active_jobs
        return Liveness(alive, where if alive else f"{where}: the job has left the queue", False)
    alive = age_s < STALE_S
    return Liveness(alive, where if alive else f"{where}: no sign of life for {age_s / 60:.0f} min", False)


class Heartbeat:
    """Touches the markers of the tasks this process runs for ``batch``, every ``HEARTBEAT_S``; the batch
    counts as running in this process until :meth:`close`."""

    def __init__(self, batch: str, interval_s: float = HEARTBEAT_S):
        self.batch = batch
        _LIVE_BATCHES.add(batch)
        self._paths: set[Path] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._interval = interval_s
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def add(self, path: Path) -> None:
        with self._lock:
            self._paths.add(path)

    def discard(self, path: Path) -> None:
        with self._lock:
            self._paths.discard(path)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                paths: Iterable[Path] = list(self._paths)
            for path in paths:
                try:
                    os.utime(path)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        _LIVE_BATCHES.discard(self.batch)
