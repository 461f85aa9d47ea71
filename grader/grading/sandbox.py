"""Run one untrusted process: its own session and process group, a private working directory, a
minimal environment, a wall-clock limit, a memory limit and capped output capture.

What this gives, and what it does not:

* The process and every child it starts share a new process group (``start_new_session``). On a
  timeout, on too much memory, and after every normal exit the whole group is killed, so nothing the
  student started outlives the run. A child that leaves the group (``setsid``) is still found: the
  environment carries a per-run token, and any process whose environment holds it is killed too.
* Memory: ``RLIMIT_AS`` (set by the worker itself, before student code is imported) on the CPU.
  CUDA reserves hundreds of GB of virtual address space at initialisation, so on CUDA the address
  space is not limited; instead the parent polls the resident memory of the process group and kills
  it above the limit. Both report "used more than N MB of memory".
* stdout and stderr are read by the parent and capped: the first ``output_cap`` bytes of each are
  kept, the rest is counted and dropped (printing never blocks or kills the student's run).
* It is not a security boundary against a determined attacker: the process runs as the grader's
  user and can read whatever that user can. Grade untrusted submissions in a container or VM with
  only the grader installed (see grader/grading/README.md).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

POLL_S = 0.1
TOKEN_VAR = "GRADER_WORKER_TOKEN"
_ACTIVE: dict[int, str] = {}  # process group -> token, for kill_active()
_ACTIVE_LOCK = threading.Lock()


@dataclass
class Captured:
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


@dataclass
class Outcome:
    returncode: int | None
    timed_out: bool
    memory_exceeded: bool
    elapsed_s: float
    stdout: Captured
    stderr: Captured
    leftover_killed: int  # processes still running after the main one ended (killed)

    @property
    def signal_name(self) -> str | None:
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"


class _Reader(threading.Thread):
    """Drain a pipe, keeping the first ``cap`` bytes."""

    def __init__(self, stream, cap: int):
        super().__init__(daemon=True)
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

    def captured(self) -> Captured:
        return Captured(b"".join(self.chunks), self.total)


def minimal_env(extra: dict[str, str], home: str) -> dict[str, str]:
    """PATH, locale, the device/CUDA/Triton variables the run needs; HOME and TMPDIR point at ``home``."""
    keep = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "TRITON_INTERPRET", "GRADER_DEVICE")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith(("CUDA_", "NVIDIA_"))}
    env.update(HOME=home, TMPDIR=home, TRITON_CACHE_DIR=os.path.join(home, ".triton"), PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1", MPLCONFIGDIR=os.path.join(home, ".mpl"))
    env.update(extra)
    return env


class Process:
    """One untrusted process, started in its own session: a handle to watch it, stop it and read what it
    printed. A thread polls its process group's resident memory when ``rss_limit_bytes`` is set and kills
    the group above it."""

    def __init__(self, argv: Sequence[str], *, cwd: str, env: dict[str, str], rss_limit_bytes: int | None,
                 output_cap: int, pass_fds: Sequence[int] = (), stdin_data: bytes | None = None):
        self.token = secrets.token_hex(16)
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env={**env, TOKEN_VAR: self.token},
            start_new_session=True, pass_fds=tuple(pass_fds), close_fds=True,
        )
        with _ACTIVE_LOCK:
            _ACTIVE[self.proc.pid] = self.token
        self.readers = [_Reader(self.proc.stdout, output_cap), _Reader(self.proc.stderr, output_cap)]
        for r in self.readers:
            r.start()
        if stdin_data is not None:
            threading.Thread(target=_feed, args=(self.proc.stdin, stdin_data), daemon=True).start()
        self.memory_exceeded = False
        self.timed_out = False
        self.leftover_killed = 0
        self._stopped = threading.Event()
        if rss_limit_bytes is not None:
            threading.Thread(target=self._watch_memory, args=(rss_limit_bytes,), daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _watch_memory(self, limit: int) -> None:
        while not self._stopped.wait(POLL_S):
            if self.proc.poll() is not None:
                return
            if group_rss(self.proc.pid) > limit:
                self.memory_exceeded = True
                kill_all(self.proc.pid, self.token)
                return

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to exit; True if it did."""
        try:
            self.proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, *, timed_out: bool = False) -> Outcome:
        """Kill whatever is left of the process and everything it started; what happened."""
        self.timed_out = self.timed_out or timed_out
        self._stopped.set()
        self.leftover_killed += kill_all(self.proc.pid, self.token)
        self.proc.wait()
        with _ACTIVE_LOCK:
            _ACTIVE.pop(self.proc.pid, None)
        elapsed = time.monotonic() - self.start
        for r in self.readers:
            r.join(timeout=5)
        for stream in (self.proc.stdout, self.proc.stderr, self.proc.stdin):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        killed = self.timed_out or self.memory_exceeded
        return Outcome(
            returncode=None if killed else self.proc.returncode,
            timed_out=self.timed_out,
            memory_exceeded=self.memory_exceeded,
            elapsed_s=elapsed,
            stdout=self.readers[0].captured(),
            stderr=self.readers[1].captured(),
            leftover_killed=self.leftover_killed,
        )


def run(
    argv: Sequence[str],
    *,
    stdin_data: bytes,
    cwd: str,
    env: dict[str, str],
    timeout_s: float,
    rss_limit_bytes: int | None,
    output_cap: int,
    pass_fds: Sequence[int] = (),
) -> Outcome:
    """Run ``argv`` to completion or until a limit is hit; always kills the whole process group."""
    process = Process(argv, cwd=cwd, env=env, rss_limit_bytes=rss_limit_bytes, output_cap=output_cap,
                      pass_fds=pass_fds, stdin_data=stdin_data)
    exited = process.wait(timeout_s)
    return process.stop(timed_out=not exited and not process.memory_exceeded)


def _feed(stream, data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        stream.write(data)
        stream.close()


def _group_members(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            pids.append(int(entry))
    return pids


def group_rss(pgid: int) -> int:
    """Resident bytes of every process in the group."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in _group_members(pgid):
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def _token_holders(token: str) -> list[int]:
    needle = f"{TOKEN_VAR}={token}".encode()
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


def kill_all(pgid: int, token: str) -> int:
    """SIGKILL the process group and every process carrying ``token``; returns how many besides the
    group leader were still alive."""
    others = [p for p in _group_members(pgid) if p != pgid]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    escaped = [p for p in _token_holders(token) if p != pgid and p not in others]
    for pid in escaped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(others) + len(escaped)


def kill_active() -> None:
    """Kill every sandboxed process group still running (on Ctrl-C)."""
    with _ACTIVE_LOCK:
        active = list(_ACTIVE.items())
    for pgid, token in active:
        kill_all(pgid, token)
