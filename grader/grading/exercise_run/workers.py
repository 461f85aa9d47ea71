"""One sandboxed worker process, from the grader's side: how it is started (with only the grader package
importable, in the sandbox where there is one, connected to the GPU's arbiter), its two pipes, waiting for a reply
within a limit that moves on while the worker waits for the GPU, and what its end says (why it ended, the tail of
its stderr, its log). :mod:`.supervise` decides what to ask it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

from grader.grading.config import RunSettings
from grader.grading.isolation import bwrap, bytecode, channel, processes, protocol, wire
from grader.grading.isolation.gpu_arbiter import GpuArbiter

MB = 1 << 20
GRACE_S = 10.0  # beyond a call's limit: moving its inputs and outputs, and the worker's own watchdog
STDERR_TAIL_LINES = 15
_NOISE = ("Extension modules:", '  File "<frozen runpy>"', '  File "<string>"', "Current thread 0x",
          "Thread 0x", "Timeout (")

# Runs the worker with only the grader package importable: the folder holding it (in the sandbox, the
# package's own bind; without one, a private directory holding a link to it) goes first on sys.path, and -I
# keeps out the working directory, PYTHONPATH and the user site (and every PYTHON* variable: -u keeps its
# prints unbuffered, so a worker that is stopped loses none of them).
def boot(module: str) -> str:
    """The ``python -c`` code that runs ``module`` as ``__main__`` with the folder in argv[1] first on sys.path."""
    return ("import sys; sys.path.insert(0, sys.argv[1]); del sys.argv[1]; import runpy; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")


_BOOT = boot("grader.grading.isolation.worker")


def worker_view(settings: RunSettings, root: Path) -> tuple[str, str]:
    """Where the worker sees the implementation tree ``root`` and the grader package."""
    if settings.sandbox is not None:
        return bwrap.SUBMISSION, bwrap.PACKAGE
    return str(root), str(package_link(settings.workdir) / "grader")


def package_link(workdir: Path) -> Path:
    """A directory whose only entry is a link to the grader package (never the repository root)."""
    import grader

    link_dir = workdir / "pkg"
    link = link_dir / "grader"
    if not link.exists():
        link_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            link.symlink_to(Path(grader.__file__).resolve().parent, target_is_directory=True)
    return link_dir


class Ended(Exception):
    """The worker is gone (crashed, stopped, or sent garbage); ``why`` says how."""

    def __init__(self, why: str, outcome: processes.Outcome | None = None, *, broken_context: bool = False,
                 malformed: bool = False):
        super().__init__(why)
        self.why = why
        self.outcome = outcome
        self.broken_context = broken_context  # the worker said its CUDA context is broken, and exited
        self.malformed = malformed  # it sent something the protocol does not allow: the run ends


class Worker:
    """One worker process and its two pipes."""

    def __init__(self, settings: RunSettings, root: Path, scratch: Path, cache_dir: Path | None,
                 extra_fields: dict, arbiter: GpuArbiter | None = None, *, compile_allowance_s: float | None = None):
        self.settings = settings
        self.extra_fields = extra_fields
        # Triton compiling the student's kernels (the worker says when): not the call's time, up to this much
        self.compile_allowance_s = settings.timeout_s if compile_allowance_s is None else compile_allowance_s
        self.compile_s = 0.0  # compilations ended
        self.compilations: list[tuple[str, float]] = []  # (what, seconds), each stretch of compiling
        self._compiling: tuple[str, float] | None = None  # (what, since) while the worker compiles
        self.gate = arbiter.connect(f"the worker of {scratch.name}") if arbiter is not None else None
        try:
            self._spawn(settings, root, scratch, cache_dir)
        except BaseException:
            # A connection whose process never started would never answer a pause: every later turn alone on
            # the GPU would wait for it, and the batch with them.
            if self.gate is not None:
                self.gate.close()
            raise
        if self.gate is not None:
            self.gate.name += f" (pid {self.process.pid})"
            if settings.nice > 0:  # a turn alone may wait for its GPU work: see GpuArbiter
                self.gate.hurry = lambda on: self.process.set_niceness(0 if on else settings.nice)
            self.gate.started()

    def _spawn(self, settings: RunSettings, root: Path, scratch: Path, cache_dir: Path | None) -> None:
        gate_fds = self.gate.process_fds if self.gate is not None else ()
        cwd = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        try:
            box = settings.sandbox
            home = bwrap.SCRATCH if box is not None else str(cwd)
            env = processes.minimal_env({"GRADER_DEVICE": settings.device, **settings.env}, home=home)
            if cache_dir is not None:  # compiled kernels are shared by one submission's workers, never across students
                cache_dir.mkdir(parents=True, exist_ok=True)
                env["TRITON_CACHE_DIR"] = bwrap.TRITON_CACHE if box is not None else str(cache_dir)
            if settings.device == "cpu":
                env["TRITON_INTERPRET"] = "1"
            lib = bwrap.LIB if box is not None else str(package_link(settings.workdir))
            pycache = bytecode.for_sandbox() if box is not None else None
            argv = [sys.executable, "-I", *bytecode.options(pycache), "-u", "-c", _BOOT, lib,
                    "--requests-fd", str(req_r), "--fd", str(rep_w), "--file-mb", str(settings.result_cap_mb)]
            if settings.memory_mb and settings.device != "cuda":  # CUDA needs a huge address space: see processes.py
                argv += ["--memory-mb", str(settings.memory_mb)]
            if gate_fds:
                argv += ["--gate", ",".join(map(str, gate_fds))]
            if settings.nice > 0:
                argv += ["--nice", str(settings.nice)]
            if box is not None:
                import grader

                binds = bwrap.worker_binds(submission=root, package=Path(grader.__file__).resolve().parent,
                                           scratch=cwd, triton_cache=cache_dir, pycache=pycache)
                argv, env = box.command(argv, binds=binds, env=env, cwd=home), {}
            rss = settings.memory_mb * MB if settings.memory_mb else None
            self.process = processes.Process(argv, cwd=str(cwd), env=env, rss_limit_bytes=rss,
                                             output_cap=settings.output_cap, pass_fds=(req_r, rep_w, *gate_fds),
                                             pid_namespace=box is not None)
        except BaseException:
            os.close(self._req_w)
            os.close(self._rep_r)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._replies: queue.Queue = queue.Queue()
        self._writes: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, name="worker replies", daemon=True).start()
        threading.Thread(target=self._write, name="worker requests", daemon=True).start()
        self.outcome: processes.Outcome | None = None
        self.replied_at: float | None = None  # when its last message came: from then on it waits for the grader

    def _read(self) -> None:
        with os.fdopen(self._rep_r, "rb", buffering=0) as stream:
            while True:
                try:
                    record = channel.read_record(stream, max_bytes=self.settings.result_cap_mb * MB)
                except channel.ChannelError as exc:
                    self._replies.put(exc)
                    return
                except OSError:
                    record = None
                if record is None:
                    self._replies.put(None)
                    return
                try:
                    message = wire.decode(record, extra_fields=self.extra_fields)
                except protocol.ProtocolError as exc:
                    self._replies.put(exc)
                    return
                if isinstance(message, protocol.Compiling):
                    self._compiling = (message.what, time.monotonic())
                elif isinstance(message, protocol.Compiled):
                    if self._compiling is not None:
                        what, since = self._compiling
                        self.compilations.append((what, time.monotonic() - since))
                        self.compile_s += time.monotonic() - since
                    self._compiling = None
                else:
                    self.replied_at = time.monotonic()
                    self._replies.put(message)

    def _write(self) -> None:
        while (record := self._writes.get()) is not None:
            try:
                channel.write_record(self._req_w, record)
            except OSError:  # the worker is gone: its reply queue says how
                break
        with contextlib.suppress(OSError):
            os.close(self._req_w)

    def send(self, message, *, doing: str = "") -> None:
        """Send ``message``; ``doing`` names what it has the worker run (the GPU's arbiter counts a turn's wait for
        it under that name)."""
        if self.gate is not None and doing:
            self.gate.doing = doing
        self._writes.put(wire.encode(message))

    def waited(self) -> float:
        """Seconds of this worker's that are not its calls': waiting for the GPU (another process had it alone), and
        Triton compiling its kernels (up to :attr:`compile_allowance_s`)."""
        gpu = self.gate.waiting_now() if self.gate is not None else 0.0
        return gpu + min(self.compiling_s(), self.compile_allowance_s)

    def compiling_s(self) -> float:
        """Seconds Triton has compiled this worker's kernels so far, the compilation under way included."""
        compiling = self._compiling
        return self.compile_s + (time.monotonic() - compiling[1] if compiling is not None else 0.0)

    def _compile_overrun(self) -> str | None:
        """Why the compilation under way must stop: it has run past its own limit."""
        compiling = self._compiling
        if compiling is None or time.monotonic() - compiling[1] <= self.settings.compile_timeout_s:
            return None
        return (f"compiling {compiling[0]} took longer than the {self.settings.compile_timeout_s:g} s allowed for "
                "one compilation (stopped; compiling is not counted in the call's time limit, but has a limit of its "
                "own: a smaller block or fewer autotuning configurations compile faster)")

    def receive(self, deadline: float, limit_text: str):
        """The next reply; raises _Ended if the worker ends, sends garbage, or misses ``deadline`` (moved on by
        the time it waits for the GPU meanwhile)."""
        waited = self.waited()
        while True:
            if (overrun := self._compile_overrun()) is not None:
                raise Ended(overrun, self.stop(timed_out=True))
            left = deadline + self.waited() - waited - time.monotonic()
            if left > 0:
                try:
                    reply = self._replies.get(timeout=min(left, 1.0))  # limits move on while it waits or compiles
                    break
                except queue.Empty:
                    continue
            outcome = self.stop(timed_out=True)
            raise Ended(limit_text, outcome) from None
        if isinstance(reply, Exception):
            outcome = self.stop()
            raise Ended(f"the worker sent a malformed result: {reply}", outcome, malformed=True)
        if reply is None:  # the worker closed its channel: it exited or was killed
            self.process.wait(5.0)
            outcome = self.stop()
            raise Ended(why_ended(outcome, self.settings), outcome)
        return reply

    def stop(self, *, timed_out: bool = False) -> processes.Outcome:
        if self.outcome is None:
            self._writes.put(None)
            self.outcome = self.process.stop(timed_out=timed_out)
            if self.gate is not None:
                self.gate.close()
        return self.outcome

    def finish(self) -> processes.Outcome:
        self.process.kill_leftovers()  # while the worker waits: in a sandbox, bwrap waits for every process in it
        self.send(protocol.Finish())
        self.process.wait(10.0)
        return self.stop()


def why_ended(outcome: processes.Outcome, settings: RunSettings) -> str:
    if outcome.returncode == 1 and "Timeout (" in outcome.stderr.text():  # the worker's own watchdog
        return f"took longer than the {settings.call_timeout_s:g} s allowed for one call (stopped)"
    if outcome.timed_out:
        return f"timed out after {settings.timeout_s:g} s (stopped, with every process it started)"
    if outcome.memory_exceeded:
        return f"used more than {settings.memory_mb} MB of memory (stopped, with every process it started)"
    if outcome.signal_name:
        return f"crashed with {outcome.signal_name}"
    return f"exited early (exit code {outcome.returncode})"


def stderr_tail(outcome: processes.Outcome, grader_dir: str) -> str:
    """The end of the worker's stderr without the grader's own frames (a faulthandler dump keeps the
    student's frames and the "Fatal Python error" line)."""
    lines = [line for line in outcome.stderr.text().rstrip().splitlines()
             if line.strip() and not line.startswith(_NOISE) and grader_dir not in line]
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def log_text(outcome: processes.Outcome, attempt: int) -> str:
    head = f"--- worker run {attempt + 1}: {outcome.elapsed_s:.1f} s"
    if outcome.leftover_killed:
        head += f"; killed {outcome.leftover_killed} process(es) it left running"
    return f"{head}\n[stdout]\n{outcome.stdout.text()}\n[stderr]\n{outcome.stderr.text()}"
