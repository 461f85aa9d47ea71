"""The student-side process: ``python -m grader.grading.isolation.worker --requests-fd R --fd W`` (started by the
grader, not by hand). It imports one exercise module of one submission, then runs one request at a time
and writes what it observed (:mod:`grader.grading.isolation.protocol`). It judges nothing: the verdicts are computed
in the grader, which never imports student code.

A request that runs longer than the job's ``call_timeout_s`` (plus the budget, for speed) makes
faulthandler print every thread's stack to stderr and exit with status 1, so the report can say where
the student's code was; the grader enforces the same limit from outside in any case. Time spent waiting for
the GPU (``--gate``: another process has it alone, see :mod:`grader.checks.gpu_gate`) is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported at run time only once the limits are set
    from grader.checks.gpu_gate import NoGate
    from grader.checks.spec import Exercise
    from grader.grading.isolation.protocol import Job

MB = 1 << 20


def _limit(which: int, value: int | None) -> None:
    if value is None:
        return
    _soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


class _Watchdog:
    """faulthandler's timer for the request under way (it prints every stack and exits, even from a busy loop in
    C); its clock stops while the process waits for the GPU (:class:`grader.checks.gpu_gate.Watch`) or Triton
    compiles (:mod:`.compile_clock`), and goes on when the last of those ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._waiting_since: float | None = None  # the process waits for the GPU, or compiles
        self._pauses = 0  # reasons to stop the clock under way

    def arm(self, seconds: float) -> None:
        with self._lock:
            if seconds > 0:
                self._deadline = time.monotonic() + seconds
                if self._waiting_since is None:
                    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
                else:  # the clock starts when the wait ends
                    self._waiting_since = time.monotonic()

    def cancel(self) -> None:
        with self._lock:
            self._deadline = None
            faulthandler.cancel_dump_traceback_later()

    def pause(self) -> None:
        with self._lock:
            self._pauses += 1
            if self._waiting_since is None:
                self._waiting_since = time.monotonic()
                faulthandler.cancel_dump_traceback_later()

    def resume(self) -> None:
        with self._lock:
            self._pauses = max(0, self._pauses - 1)
            if self._pauses:
                return
            if self._waiting_since is not None and self._deadline is not None:
                self._deadline += time.monotonic() - self._waiting_since
                faulthandler.dump_traceback_later(max(0.001, self._deadline - time.monotonic()), exit=True,
                                                  file=sys.stderr)
            self._waiting_since = None


def _run(request, exercise, modules: dict, device: str, root: str = ""):
    """One request's reply. Exceptions of the student's code are results (check.execute records them);
    NotImplementedError from a call that must raise or an extra check means "not written yet"."""
    from grader.checks import execute, specialization
    from grader.grading.isolation import protocol as p
    from grader.speed import autotune, student_calls, tamper

    part = exercise.part(request.part)
    module = modules[part.name]
    match request:
        case p.CompileAhead():
            from grader.checks import compile_ahead, loader

            # A copy of the module of its own: what the calls leave in the student's globals (a table filled by a
            # kernel that did not run, a kernel handle kept) never reaches the cases, which find the kernels in
            # the student's Triton cache on disk.
            ahead = loader.load(root, exercise, part.functions, copy="_compile_ahead")
            try:
                # A part's benchmarks compile as the speed warm-up will: every candidate of every autotuning choice.
                with autotune.mode(autotune.COMPILE) if request.benchmarks else contextlib.nullcontext():
                    kernels, error = compile_ahead.compile_calls(part, ahead, request.signatures, device,
                                                                 generic=not request.benchmarks)
            finally:
                autotune.forget_untimed()  # chosen without running a candidate: the calls choose again
            return p.CompiledAhead(request.id, kernels, error)
        case p.RunCase():
            with specialization.generic():  # correctness: one compilation per dtype, not per shape
                execution = execute.execute(part, module, request.inputs, device)
            return p.CaseDone(request.id, _trim(execution, request.full))
        case p.RunBadInput():
            try:
                with specialization.generic():
                    outcome = execute.execute_bad_input(module, part.bad_inputs[request.index], device)
            except NotImplementedError as exc:
                return p.NotImplementedYet(request.id, str(exc))
            return p.BadInputDone(request.id, outcome)
        case p.RunExtra():
            extra = next(x for x in part.extra_checks if x.name == request.name)
            try:
                with specialization.generic():
                    return p.ExtraDone(request.id, dict(extra.execute(module, device)))
            except NotImplementedError as exc:
                return p.NotImplementedYet(request.id, str(exc))
        case p.WarmUp():
            with autotune.mode(autotune.COMPILE):  # compiles every candidate config, times none
                return p.WarmedUp(request.id, student_calls.warm_part(part, module))
        case p.RunSpeed():
            autotune.forget_untimed()  # autotune for real: all of the part's choices in one turn alone
            with autotune.one_turn():
                student_calls.tune_part(part, module)
            with autotune.mode(autotune.TUNE):  # recorded sharing the GPU (a choice not made yet takes a turn)
                measurement = student_calls.record_part(part, module, recheck_inputs=request.recheck_inputs)
            measurement.tampered = tamper.tampered()  # what the student's code replaced of timing's primitives
            if measurement.benchmarks and all(b.not_implemented for b in measurement.benchmarks):
                return p.NotImplementedYet(request.id, measurement.error or "not implemented")
            return p.SpeedDone(request.id, measurement)
    raise ValueError(f"not a request: {request!r}")


def _trim(ex, full: bool):
    """Correctness cases need the outputs only; integrity cases everything."""
    if not full:
        ex.ops, ex.kernels, ex.inputs_after, ex.aliased = [], [], {}, []
    return ex


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests-fd", type=int, required=True, help="where the grader's requests come from")
    parser.add_argument("--fd", type=int, required=True, help="where the replies go")
    parser.add_argument("--memory-mb", type=int, default=None, help="RLIMIT_AS (omit on CUDA)")
    parser.add_argument("--file-mb", type=int, default=None, help="RLIMIT_FSIZE: largest file it may write")
    parser.add_argument("--gate", default=None, help="R,W: the pipes to the GPU's arbiter (grader.checks.gpu_gate)")
    parser.add_argument("--nice", type=int, default=0, help="CPU niceness, before anything is imported")
    args = parser.parse_args(argv)
    if args.nice > 0:
        os.nice(args.nice)  # every thread and process it starts inherits it

    # Limits first, before anything the student controls runs; children inherit them.
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_AS, args.memory_mb * MB if args.memory_mb else None)
    _limit(resource.RLIMIT_FSIZE, args.file_mb * MB if args.file_mb else None)
    gate_fds = tuple(int(fd) for fd in args.gate.split(",")) if args.gate else ()
    for fd in (args.requests_fd, args.fd, *gate_fds):
        os.set_inheritable(fd, False)  # programs the student starts do not get the channels
    watchdog = _Watchdog()
    from grader.checks import gpu_gate

    # The gate first, before anything touches the GPU: the arbiter may have asked this process to start paused.
    gate = gpu_gate.Gate(*gate_fds, watch=watchdog) if gate_fds else gpu_gate.NO_GATE
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    faulthandler.enable(file=sys.stderr)  # a segfault prints the Python stack to the captured stderr

    from grader.grading.isolation import protocol as p
    from grader.grading.isolation import wire
    from grader.grading.isolation.channel import read_record, write_record

    requests = os.fdopen(args.requests_fd, "rb", buffering=0)

    sending = threading.Lock()  # compilations are told from the threads that compile

    def send(message) -> None:
        record = wire.encode(message)
        with sending:
            write_record(args.fd, record)

    def receive():
        record = read_record(requests)
        return p.Finish() if record is None else wire.decode(record)

    send(p.Hello(os.getpid()))
    job = receive()
    if not isinstance(job, p.Job):
        return 2

    from grader import exercises
    from grader.checks import loader

    _prepare(job, gate, watchdog, send)
    exercise = exercises.get(job.exercise)
    if job.call_timeout_s > 0:  # importing the module is student code too
        watchdog.arm(job.call_timeout_s)
    modules, errors = {}, {}
    with gate.use():
        for part in exercise.parts:
            try:
                modules[part.name] = loader.load(job.root, exercise, part.functions)
            except loader.LoadError as exc:
                errors[part.name] = p.LoadFailure(exc.kind, str(exc))
    watchdog.cancel()
    send(p.Loaded(errors))

    _serve(job, exercise, modules, gate, watchdog, send, receive)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # do not wait for threads or atexit handlers the student may have left behind


def _prepare(job: Job, gate: NoGate, watchdog: _Watchdog, send: Callable[[Any], None]) -> None:
    """Before any student code: the device, the timing primitives as they are now, the GPU's gate, the autotuner
    and the compile clock (compiling is told to the grader and not counted in a call's time), CUDA started."""
    from grader.checks import gpu_gate, runtime
    from grader.grading.isolation import protocol as p
    from grader.speed import autotune, tamper

    if job.device == "cuda":
        runtime.sleep_while_waiting()  # before its CUDA context exists: the host's cores go to compiling
    runtime.configure()
    if job.device == "cuda":
        tamper.capture_primitives()  # before any student code runs: what timing calls, as it is now
    if gate is not gpu_gate.NO_GATE:
        gpu_gate.install(gate)  # Triton's compilation never holds up another process's turn alone
    autotune.install(default=autotune.FIRST)  # correctness calls never time autotune candidates
    from grader.grading.isolation import compile_clock

    def compiling(what: str) -> None:
        watchdog.pause()
        send(p.Compiling(what))

    def compiled(seconds: float) -> None:
        send(p.Compiled(seconds))
        watchdog.resume()

    compile_clock.install(compile_clock.CompileClock(compiling, compiled))  # compiling is not the call's time
    if job.device == "cuda":
        from grader.checks import specialization

        specialization.install()
        if (why := runtime.start_cuda()) is not None:  # outside use(): no turn alone waits for it
            print(f"worker: starting CUDA failed: {why}", file=sys.stderr)


def _serve(job: Job, exercise: Exercise, modules: dict, gate: NoGate, watchdog: _Watchdog,
           send: Callable[[Any], None], receive: Callable[[], Any]) -> None:
    """Answer the grader's requests until it says finish, each call within its time limit; a CUDA context the
    student's code broke ends the worker after its reply (the grader goes on in a fresh one)."""
    from grader.checks import runtime
    from grader.grading.isolation import protocol as p

    while not isinstance(request := receive(), p.Finish):
        limit = job.call_timeout_s + (request.budget_s if isinstance(request, p.RunSpeed) else 0.0)
        if job.call_timeout_s > 0:
            watchdog.arm(limit)
        try:
            with gate.use():
                reply = _run(request, exercise, modules, job.device, job.root)
        except BaseException as exc:  # the student's SystemExit, KeyboardInterrupt, ... is a result too
            reply = p.Raised(request.id, _describe(exc))
        finally:
            watchdog.cancel()
        broken = runtime.cuda_broken() if job.device == "cuda" else None
        if broken:  # said first: the grader charges this request, and runs the rest in a fresh worker
            send(p.Poisoned(broken))
        try:
            send(reply)
        except Exception as exc:  # e.g. an output torch.save cannot write
            send(p.Raised(request.id, f"the result could not be sent to the grader: {type(exc).__name__}: {exc}"))
        if broken:
            break


def _describe(exc: BaseException) -> str:
    from grader.checks.scratch import scratch_note
    from grader.checks.student_errors import student_frames

    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    note = scratch_note(exc)  # ENOSPC: the student filled the sandbox's scratch
    return f"{text}\n{student_frames(exc)}".strip() + (f"\n{note}" if note else "")


if __name__ == "__main__":
    sys.exit(main())
