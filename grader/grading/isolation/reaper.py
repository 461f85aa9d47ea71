"""Nothing of a batch outlives its grader, however the grader ends.

:class:`Reaper` starts a small watcher process — its own session, deaf to SIGINT, SIGTERM and SIGHUP, the
standard library only — that holds the read end of a pipe whose write end only the grader has. When that
pipe closes (the grader finished, or died of anything: SIGKILL included) the watcher kills every process
whose environment carries the batch's token — each worker gets it (:data:`BATCH_VAR`, through
``RunSettings.env``), and so does everything the student's code starts, detached or not — and removes the
batch's scratch directory.

Run as a script (``python -I reaper.py TOKEN [WORKDIR]``) it is that watcher.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

BATCH_VAR = "GRADER_BATCH"


def holders(token: str) -> list[int]:
    """Processes (other than this one) whose environment holds ``BATCH_VAR=token``."""
    return env_holders(BATCH_VAR, token)


def env_holders(name: str, value: str) -> list[int]:
    """Processes (other than this one) whose environment holds ``name=value``: everything a process started
    inherits it, even in a session of its own."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_batch(token: str, rounds: int = 5) -> int:
    """SIGKILL every process of the batch (again while new ones appear); how many were found."""
    killed = 0
    for _ in range(rounds):
        pids = holders(token)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed += len(pids)
        time.sleep(0.05)
    return killed


class Reaper:
    """The grader's side: start the watcher; :meth:`close` when the batch is over."""

    def __init__(self, token: str, workdir: str | None):
        read_end, self._write_end = os.pipe()  # not inheritable: no worker ever holds the write end
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), token, workdir or ""], stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        finally:
            os.close(read_end)

    def close(self, timeout_s: float = 30.0) -> None:
        if self._write_end is not None:
            os.close(self._write_end)
            self._write_end = None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout_s)


def _watch(token: str, workdir: str) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    kill_batch(token)
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _watch(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
