"""Sharing one GPU between the grader's processes: the side of a process that runs kernels on it (a student's
worker, the trusted timer). The grader's side is :mod:`grader.grading.isolation.gpu_arbiter`.

Many processes use a GPU at once: compiling, running correctness cases, validating replays. Timing needs it
alone. A process holds a :class:`Gate` (two pipes to the arbiter of its GPU) and marks what it does:

* ``use()`` — a stretch of GPU work (a request of the grader's, a validation replay). Several processes use
  the GPU at once.
* ``released()`` — CPU work inside such a stretch (Triton compiling a kernel, building its launcher): nobody
  waits for it. On a thread of PyTorch's (a CUDA backward pass runs on one while the calling thread waits inside
  ``use()``) it releases the caller's stretch too.
* ``alone()`` — the GPU for this process alone (the timed rounds; an autotuner timing its configs). The
  arbiter first pauses every other process: each finishes the ``use()`` stretch it is in (or is compiling, which
  never holds anyone up), waits for the work it already queued on the GPU, and says so. Its compilation goes on
  meanwhile; only its next ``use()`` waits until the arbiter lets it continue.

The bytes on the pipes: from the arbiter ``P`` (pause), ``C`` (continue), ``G`` (the GPU is yours alone); to it
``D`` (paused: nothing of ours runs on the GPU), ``W`` (paused, and a thread of ours waits to use it: said once
per pause), ``A`` (asking for it alone), ``R`` (done with it). The arbiter sends ``P`` or ``C`` first, so a
process knows from its start whether it may use the GPU.

Student code runs in the worker and can ignore all this (start kernels from a thread of its own, say): that
only disturbs the timing of others, as it could without a gate; what a gate guarantees holds for the grader's
own calls and for every student who does not try.

Without a gate (pytest, ``grader bench``, the CPU) :data:`NO_GATE` stands in: nothing is shared.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

from grader.checks.host_clock import MONOTONIC, HostClock


class Watch(Protocol):
    """Told when the process waits for the GPU (the worker's watchdog stops its clock meanwhile)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class NoGate:
    """Nothing to share with: every stretch proceeds at once."""

    paused_s = 0.0

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        yield


NO_GATE = NoGate()


class Gate(NoGate):
    """A process's end of its GPU's arbiter (see the module docstring). ``watch`` (the worker's watchdog) is told
    when the process starts and stops waiting for the GPU — paused, or waiting for it alone: not its own time.
    ``clock`` times those waits (:attr:`paused_s`)."""

    def __init__(self, from_arbiter: int, to_arbiter: int, *, watch: Watch | None = None,
                 synchronize: Callable[[], None] | None = None, clock: HostClock = MONOTONIC):
        self._clock = clock
        self._read_fd, self._write_fd = from_arbiter, to_arbiter
        self._synchronize = synchronize or _synchronize  # waits for this process's GPU work, before "paused"
        self._cond = threading.Condition()
        self._local = threading.local()
        # threads inside use() and not released(), less those lent (_lend): at most 0 when none uses the GPU
        self._users = 0
        self._paused = False
        self._wants = False  # paused, and a thread waits in use(): the arbiter was told (once per pause)
        self._granted = False
        self._closed = False
        self._paused_since = 0.0
        self.paused_s = 0.0  # waiting for the GPU: paused, or waiting for it alone
        self._watch = watch
        self._send_lock = threading.Lock()
        first = self._read()
        if first == b"P":
            self._pause_now()  # nothing of ours runs yet: paused at once
        self.listener = threading.Thread(target=self._serve, name="gpu-gate", daemon=True)  # ends with the arbiter
        self.listener.start()

    # ------------------------------------------------------------------------------- the process's side

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            self._enter()
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                self._leave()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:  # a thread outside use(): see _lend
            lent = _started_outside_python() and self._lend()
            try:
                yield
            finally:
                if lent:
                    self._enter()
            return
        self._local.depth = 0
        self._leave()
        try:
            yield
        finally:
            self._enter()
            self._local.depth = depth

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self.released():  # waiting for the GPU is not using it
            asked = self._clock.now()
            self._wait_starts()
            self._send(b"A")
            with self._cond:
                while not (self._granted or self._closed):
                    self._cond.wait()
                self._granted = False
            self._waited(self._clock.now() - asked)
        try:
            yield
        finally:
            self._send(b"R")

    def _lend(self) -> bool:
        """CPU work on a thread that Python did not start, while a thread of the process is inside ``use()``:
        PyTorch runs a CUDA backward pass on a thread of its own while the calling thread waits in ``use()``, and
        Triton compiles the backward's kernels there. The caller's stretch waits on that thread, so its compilation
        releases the stretch too (True: the thread gives it back, through ``_enter``, when it is done): a pause no
        longer waits for the compiler, and the launches after it wait for the pause to end. Threads Python started
        (the grader's compiling threads, the student's) lend nothing: the thread that started them may go on with
        GPU work meanwhile."""
        with self._cond:
            if self._users <= 0:
                return False
            self._users -= 1
            self._cond.notify_all()
            return True

    def _enter(self) -> None:
        with self._cond:
            if self._paused and not self._wants:
                self._wants = True
                self._send(b"W")  # held up by the turn, not compiling: what --profile counts
            while self._paused:
                self._cond.wait()
            self._users += 1

    def _leave(self) -> None:
        with self._cond:
            self._users -= 1
            self._cond.notify_all()

    # ------------------------------------------------------------------------------- the arbiter's side

    def _serve(self) -> None:
        while True:
            byte = self._read()
            if byte == b"P":
                with self._cond:
                    self._paused, self._paused_since = True, self._clock.now()
                    while self._users > 0:
                        self._cond.wait()
                self._pause_now()
            elif byte == b"C":
                with self._cond:
                    waited = self._clock.now() - self._paused_since if self._paused else 0.0
                    self._paused = self._wants = False
                    self._cond.notify_all()
                self._waited(waited)
            elif byte == b"G":
                with self._cond:
                    self._granted = True
                    self._cond.notify_all()
            elif not byte:  # the arbiter is gone: nothing left to share with
                with self._cond:
                    self._closed, self._paused = True, False
                    self._cond.notify_all()
                return

    def _pause_now(self) -> None:
        with self._cond:
            if not self._paused:
                self._paused, self._paused_since = True, self._clock.now()
        self._synchronize()  # what this process queued before the pause has finished when the arbiter hears "D"
        self._wait_starts()
        self._send(b"D")

    def _wait_starts(self) -> None:
        if self._watch is not None:
            self._watch.pause()

    def _waited(self, seconds: float) -> None:
        self.paused_s += seconds
        if self._watch is not None:
            self._watch.resume()

    def _read(self) -> bytes:
        try:
            return os.read(self._read_fd, 1)
        except OSError:
            return b""

    def _send(self, byte: bytes) -> None:
        with self._send_lock, contextlib.suppress(OSError):
            os.write(self._write_fd, byte)


def _started_outside_python() -> bool:
    """Is this thread one that Python's ``threading`` did not start (a thread of PyTorch's autograd engine)?"""
    return isinstance(threading.current_thread(), threading._DummyThread)


def _synchronize() -> None:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception as exc:  # a broken context has nothing left to run: the pause holds all the same
        print(f"gpu gate: synchronizing for a pause failed: {type(exc).__name__}: {exc}", file=sys.stderr)


_current: NoGate = NO_GATE


def current() -> NoGate:
    """This process's gate (:data:`NO_GATE` unless :func:`install` was called)."""
    return _current


def install(gate: NoGate) -> None:
    """Make ``gate`` this process's, and let Triton's compilation (compiling a kernel, loading it and building its
    launcher) run outside ``use()``: it is CPU work, and a pause never waits for it."""
    global _current
    _current = gate
    import triton.compiler as triton_compiler

    compile_kernel = triton_compiler.compile
    if getattr(compile_kernel, "_grader_gate", False):
        return

    def compile_released(*args, **kwargs):
        with current().released():
            return compile_kernel(*args, **kwargs)

    compile_released._grader_gate = True  # type: ignore[attr-defined]
    triton_compiler.compile = compile_released  # JITFunction takes it from here when it first runs
    kernel_class = getattr(triton_compiler, "CompiledKernel", None)
    init_handles = getattr(kernel_class, "_init_handles", None)
    if init_handles is not None:

        def init_handles_released(self, *args, **kwargs):
            with current().released():
                return init_handles(self, *args, **kwargs)

        kernel_class._init_handles = init_handles_released
