"""Run one untrusted process: its own session and process group, a private working directory, a
minimal environment, a wall-clock limit, a memory limit and capped output capture.

What this gives, and what it does not:

* Lifetime. A process started in a sandbox (:mod:`grader.grading.isolation.bwrap`, ``pid_namespace=True``) runs in
  a PID namespace of its own: killing it (bwrap) ends the namespace, and every process in it, however it
  detached (``setsid``, a dropped environment, a double fork). Without a sandbox the process and its children
  share a new process group (``start_new_session``) that is killed after every run, and a child that leaves
  the group is still found by a per-run token in its environment (one that also drops its environment is
  not: that needs the sandbox).
* Stopping never waits forever: a killed process is waited for a bounded time, and the threads reading its
  output are given a bounded time to drain; a pipe still held by a process that could not be killed is left
  to its daemon thread instead of blocking the grader.
* Memory: ``RLIMIT_AS`` (set by the worker itself, before student code is imported) on the CPU.
  CUDA reserves hundreds of GB of virtual address space at initialisation, so on CUDA the address
  space is not limited; instead the parent polls the resident memory of the run's processes and kills
  them above the limit. Both report "used more than N MB of memory".
* stdout and stderr are read by the parent and capped (:mod:`.output_capture`): the first ``output_cap`` bytes of
  each are kept, the rest is counted and dropped (printing never blocks or kills the student's run).
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

from grader.grading.isolation import proctree, reaper, threads
from grader.grading.isolation.output_capture import Captured, OutputReader, feed

POLL_S = 0.1
# The memory watch looks again before a process growing this fast could have filled the room left below its limit
# (touching fresh pages runs at a few GB/s), and at least this often. Far below the limit that is once a second:
# walking a worker's threads at 10 Hz, for twenty workers, took a sixth of the grader's CPU in a batch.
GROWTH_BYTES_PER_S = 8 << 30
MEMORY_POLL_MAX_S = 1.0
WAIT_S = 10.0  # for a killed process to be reaped (it only takes longer in uninterruptible sleep)
DRAIN_S = 5.0  # for the output readers to reach the end of the pipes once the process is gone
TOKEN_VAR = "GRADER_WORKER_TOKEN"
_ACTIVE: dict[int, Process] = {}  # pid -> running process, for kill_active()
_ACTIVE_LOCK = threading.Lock()


def memory_poll_s(limit: int, used: int) -> float:
    """Seconds until the memory watch looks again at processes holding ``used`` of ``limit`` resident bytes."""
    return min(MEMORY_POLL_MAX_S, max(POLL_S, (limit - used) / GROWTH_BYTES_PER_S))


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


def minimal_env(extra: dict[str, str], home: str) -> dict[str, str]:
    """PATH, locale, the device/CUDA/Triton variables the run needs; HOME and TMPDIR point at ``home``; one CPU
    thread (:mod:`~grader.grading.isolation.threads`)."""
    keep = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "TRITON_INTERPRET", "GRADER_DEVICE")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith(("CUDA_", "NVIDIA_"))}
    env.update(HOME=home, TMPDIR=home, TRITON_CACHE_DIR=os.path.join(home, ".triton"), PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1", MPLCONFIGDIR=os.path.join(home, ".mpl"), **threads.child_env())
    env.update(extra)
    return env


class Process:
    """One untrusted process, started in its own session: a handle to watch it, stop it and read what it
    printed. A thread polls the resident memory of its processes when ``rss_limit_bytes`` is set and kills
    them above it. ``pid_namespace``: ``argv`` starts a sandbox with a PID namespace of its own (bwrap), whose
    first process inside is its init and the second the command."""

    def __init__(self, argv: Sequence[str], *, cwd: str, env: dict[str, str], rss_limit_bytes: int | None,
                 output_cap: int, pass_fds: Sequence[int] = (), stdin_data: bytes | None = None,
                 pid_namespace: bool = False):
        self.pid_namespace = pid_namespace
        self.token = None if pid_namespace else secrets.token_hex(16)
        self._namespace: str | None = None
        self._namespace_fd: int | None = None
        self._namespace_lock = threading.Lock()
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
            env=env if self.token is None else {**env, TOKEN_VAR: self.token},
            start_new_session=True, pass_fds=tuple(pass_fds), close_fds=True,
        )
        with _ACTIVE_LOCK:
            _ACTIVE[self.proc.pid] = self
        self.readers = [OutputReader(self.proc.stdout, output_cap), OutputReader(self.proc.stderr, output_cap)]
        for r in self.readers:
            r.start()
        if stdin_data is not None:
            threading.Thread(target=feed, args=(self.proc.stdin, stdin_data), name="worker stdin",
                             daemon=True).start()
        self.memory_exceeded = False
        self._cpu_seen = 0.0
        self._cpu_lock = threading.Lock()
        self._ended = threading.Event()  # the process has exited (reaped only by stop(): its pid stays its own)
        threading.Thread(target=self._watch_exit, name="process exit", daemon=True).start()
        self.timed_out = False
        self.leftover_killed = 0
        self._killed: set[int] = set()
        self._stopped = threading.Event()
        if rss_limit_bytes is not None or pid_namespace:  # a sandbox's CPU is read here too: see cpu_s()
            threading.Thread(target=self._watch_memory, args=(rss_limit_bytes,), name="memory watch",
                             daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_s(self) -> float:
        """CPU seconds the process and everything under it have used so far (the sandbox, the command, the
        compilers it ran). Once it has ended: read as it exited, with the children it waited for; a sandbox (whose
        bwrap does not wait for the processes inside) as last read while it ran, by this or by the memory watch
        (at least once a second); one that was killed, as it was just before."""
        if not self._exited():
            self._saw_cpu(proctree.cpu_seconds(proctree.descendants(self.proc.pid)))
        return self._cpu_seen

    def _saw_cpu(self, seconds: float) -> None:
        with self._cpu_lock:  # three threads read it: the figure never goes back
            self._cpu_seen = max(self._cpu_seen, seconds)

    def _watch_exit(self) -> None:
        """Wait for the process to exit and read it once more (a zombie keeps its CPU times, and those of the
        children it waited for), without reaping it: until stop() has killed what is left and reaps it, its pid
        and process group cannot be another process's. Every wait of this class waits for this thread."""
        try:
            if hasattr(os, "waitid"):  # Linux
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
                    self._saw_cpu(proctree.cpu_seconds([self.proc.pid]))
            else:  # elsewhere it is reaped here, and the last reading stands
                self.proc.wait()
        finally:
            self._ended.set()

    def _exited(self) -> bool:
        return self._ended.is_set()

    def _watch_memory(self, limit: int | None) -> None:
        """Kill the process above ``limit`` bytes resident; and read its CPU each time (without a limit, once a
        second: a sandbox only)."""
        wait = POLL_S
        while not self._stopped.wait(wait):
            if self._exited():
                return
            # In a sandbox every process of the namespace descends from bwrap (orphans go to its init): walking
            # that tree reads a few files, where listing the namespace reads every process of the host.
            pids = proctree.descendants(self.proc.pid) if self.pid_namespace else self._processes()
            # the last figure of a sandbox that ends by itself (bwrap does not wait for its init: its exit says none)
            self._saw_cpu(proctree.cpu_seconds(pids))
            if limit is None:
                wait = MEMORY_POLL_MAX_S
                continue
            used = proctree.rss(pids)
            if used > limit:
                self.memory_exceeded = True
                self.kill()
                return
            wait = memory_poll_s(limit, used)

    def set_niceness(self, nice: int) -> None:
        """The CPU niceness of every thread of the process and of everything under it (see
        :func:`.proctree.set_niceness`)."""
        if not self._exited():
            proctree.set_niceness(proctree.descendants(self.proc.pid), nice)

    def namespace(self) -> str | None:
        """The sandbox's PID namespace (``pid:[inode]``), once bwrap has made it. It is held open until
        stop() returns: a namespace's number is reused once it is freed, and must never name another run's (nor
        may bwrap's pid, once reaped)."""
        with self._namespace_lock:  # the memory watch asks too
            if self.pid_namespace and self._namespace is None and self.proc.returncode is None:
                own = proctree.pid_namespace(os.getpid())
                for child in proctree.children(self.proc.pid):
                    try:
                        fd = os.open(f"/proc/{child}/ns/pid", os.O_RDONLY)
                    except OSError:
                        continue
                    found = proctree.pid_namespace_of_fd(fd)
                    if found is not None and found != own:
                        self._namespace, self._namespace_fd = found, fd
                        break
                    os.close(fd)
            return self._namespace

    def _processes(self) -> list[int]:
        """Every process of this run, the one started first included."""
        if self.pid_namespace:
            namespace = self.namespace()
            return [self.proc.pid] + ([pid for pid, _ in proctree.namespace_members(namespace)] if namespace else [])
        return proctree.group_members(self.proc.pid)

    def leftovers(self) -> list[int]:
        """The processes of this run besides the command itself (and bwrap's init, in a sandbox)."""
        if self.pid_namespace:
            namespace = self.namespace()
            return [pid for pid, inner in proctree.namespace_members(namespace) if inner > 2] if namespace else []
        members = [p for p in proctree.group_members(self.proc.pid) if p != self.proc.pid]
        return members + [p for p in _token_holders(self.token or "") if p != self.proc.pid and p not in members]

    def kill_leftovers(self) -> int:
        """SIGKILL what the command left running besides itself; how many (each counted once)."""
        found = [pid for pid in self.leftovers() if pid not in self._killed]
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._killed.update(found)
        self.leftover_killed = len(self._killed)
        return len(found)

    def kill(self) -> None:
        """SIGKILL the process and everything it started."""
        if self.pid_namespace:
            namespace = self.namespace()
            members = [pid for pid, _ in proctree.namespace_members(namespace)] if namespace else []
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.proc.pid, signal.SIGKILL)  # bwrap: its init dies with it (--die-with-parent)
            for pid in members:  # and everything else of the namespace at once, not one after the other
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        else:
            kill_all(self.proc.pid, self.token or "")

    def alive(self) -> bool:
        return not self._exited()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to exit; True if it did."""
        return self._ended.wait(max(0.0, timeout_s))

    def stop(self, *, timed_out: bool = False) -> Outcome:
        """Kill whatever is left of the process and everything it started; what happened. Returns within
        about ``WAIT_S + DRAIN_S`` seconds whatever the processes do."""
        self.timed_out = self.timed_out or timed_out
        self._stopped.set()
        self.cpu_s()  # the last figure, before the kill
        self.kill_leftovers()
        self.kill()
        exited = self.wait(WAIT_S)
        if exited:
            self.proc.wait()  # reaped now that nothing of it is left to kill
        elapsed = time.monotonic() - self.start
        namespace, gone_by = self.namespace(), time.monotonic() + WAIT_S
        while namespace and proctree.namespace_members(namespace) and time.monotonic() < gone_by:
            time.sleep(POLL_S / 5)  # SIGKILLed processes take a moment to go: none is left when this returns
        with self._namespace_lock:
            if self._namespace_fd is not None:
                os.close(self._namespace_fd)
                self._namespace, self._namespace_fd = None, None
        with _ACTIVE_LOCK:
            _ACTIVE.pop(self.proc.pid, None)
        drained = time.monotonic() + DRAIN_S
        for r in self.readers:
            r.join(timeout=max(0.0, drained - time.monotonic()))
        killed = self.timed_out or self.memory_exceeded
        return Outcome(
            returncode=None if killed or not exited else self._returncode(),
            timed_out=self.timed_out,
            memory_exceeded=self.memory_exceeded,
            elapsed_s=elapsed,
            stdout=self.readers[0].captured(),
            stderr=self.readers[1].captured(),
            leftover_killed=self.leftover_killed,
        )

    def _returncode(self) -> int | None:
        code = self.proc.returncode
        if self.pid_namespace and code is not None and 128 < code < 128 + 65:
            return -(code - 128)  # bwrap's init reports a command killed by signal N as 128 + N, like a shell
        return code


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


def _token_holders(token: str) -> list[int]:
    return reaper.env_holders(TOKEN_VAR, token)


def kill_all(pgid: int, token: str) -> int:
    """SIGKILL the process group and every process carrying ``token``; returns how many besides the
    group leader were still alive."""
    others = [p for p in proctree.group_members(pgid) if p != pgid]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    escaped = [p for p in _token_holders(token) if p != pgid and p not in others]
    for pid in escaped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(others) + len(escaped)


def kill_active() -> None:
    """Kill every worker still running, and what it started (on Ctrl-C)."""
    with _ACTIVE_LOCK:
        active = list(_ACTIVE.values())
    for process in active:
        process.kill()
