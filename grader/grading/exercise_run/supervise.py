"""Run a planned exercise in sandboxed workers, one item at a time.

The grader starts a worker (:mod:`grader.grading.isolation.worker`) in a sandbox
(:mod:`grader.grading.isolation.bwrap`; in its own process group only, where the instructor opted out of the
sandbox) with two pipes of its own, sends the job, then one request per item and waits for the reply, within
a limit per call (the ``call_timeout_s``, plus the timing budget for speed) and for the whole exercise
(``timeout_s``). While the worker runs an item, the grader judges the previous reply (``on_reply``) and builds
the next item's inputs, so its CPU work overlaps the worker's.

A worker that crashes, overruns a limit or sends something that is not a message is stopped (with every
process it started), the item it was running fails with the reason, and a new worker goes on with the items not
reached, while the restarts make progress. A worker whose CUDA context an item left broken says so and exits:
that item keeps its own result and a fresh worker runs the rest. A part that crashed (or broke) more than
``max_restarts`` workers runs no more items; the other parts go on. A crash while importing the module, a
malformed message and the exercise's time limit end the run.

On a GPU every worker is connected to the GPU's arbiter (:mod:`grader.grading.isolation.gpu_arbiter`): the workers share
the GPU, and one that autotunes asks for it alone, as the trusted timer does for its timed rounds; a worker paused
meanwhile goes on compiling, and the time it waits for the GPU is added to its limits. A speed item compiles its
benchmarks' kernels first (``WarmUp``), then autotunes and records them (``RunSpeed``). A worker that
ends, or does not start within a call's limit, before it says hello ran no student code: that is the grader's
fault (:class:`WorkerStartError`), never the student's.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading.config import RunSettings
from grader.grading.exercise_run.plan import Item
from grader.grading.exercise_run.references import CaseReferences
from grader.grading.isolation import bwrap, channel, processes, protocol
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


@dataclass
class Run:
    """What the workers did with a plan: a reply per item, or why there is none."""

    replies: dict[str, protocol.ItemReply] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # item id -> why it has no reply
    not_run: dict[str, str] = field(default_factory=dict)  # item id -> why it was not sent (not implemented, ...)
    loaded: bool = False
    load_errors: dict[str, protocol.LoadFailure] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    profile: dict[str, float] = field(default_factory=dict)  # seconds per step
    to_time: list[tuple[Item, protocol.RunSpeed, protocol.SpeedDone]] = field(default_factory=list)  # defer_speed

    def add_time(self, step: str, seconds: float) -> None:
        self.profile[step] = self.profile.get(step, 0.0) + seconds

    @classmethod
    def merged(cls, runs: list[Run]) -> Run:
        """The runs of one exercise's parts (each in workers of its own) as one."""
        out = cls(loaded=bool(runs) and all(r.loaded for r in runs))
        for run in runs:
            out.replies.update(run.replies)
            out.failed.update(run.failed)
            out.not_run.update(run.not_run)
            out.load_errors.update(run.load_errors)
            out.problems += [p for p in run.problems if p not in out.problems]
            out.logs += run.logs
            out.to_time += run.to_time
            for step, seconds in run.profile.items():
                out.add_time(step, seconds)
        return out


class WorkerStartError(RuntimeError):
    """The worker ended before it ran anything of the student's: the sandbox or the environment is broken."""


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


class _Ended(Exception):
    """The worker is gone (crashed, stopped, or sent garbage); ``why`` says how."""

    def __init__(self, why: str, outcome: processes.Outcome | None = None, *, broken_context: bool = False):
        super().__init__(why)
        self.why = why
        self.outcome = outcome
        self.broken_context = broken_context  # the worker said its CUDA context is broken, and exited


class _Worker:
    """One worker process and its two pipes."""

    def __init__(self, settings: RunSettings, root: Path, scratch: Path, cache_dir: Path | None,
                 extra_fields: dict, arbiter: GpuArbiter | None = None):
        self.settings = settings
        self.extra_fields = extra_fields
        self.gate = arbiter.connect(f"the worker of {scratch.name}") if arbiter is not None else None
        gate_fds = self.gate.process_fds if self.gate is not None else ()
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        cwd = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
        box = settings.sandbox
        home = bwrap.SCRATCH if box is not None else str(cwd)
        env = processes.minimal_env({"GRADER_DEVICE": settings.device, **settings.env}, home=home)
        if cache_dir is not None:  # compiled kernels are shared by one submission's workers, never across students
            cache_dir.mkdir(parents=True, exist_ok=True)
            env["TRITON_CACHE_DIR"] = bwrap.TRITON_CACHE if box is not None else str(cache_dir)
        if settings.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        lib = bwrap.LIB if box is not None else str(package_link(settings.workdir))
        argv = [sys.executable, "-I", "-u", "-c", _BOOT, lib,
                "--requests-fd", str(req_r), "--fd", str(rep_w), "--file-mb", str(settings.result_cap_mb)]
        if settings.memory_mb and settings.device != "cuda":  # CUDA needs a huge address space: see processes.py
            argv += ["--memory-mb", str(settings.memory_mb)]
        if gate_fds:
            argv += ["--gate", ",".join(map(str, gate_fds))]
        if box is not None:
            import grader

            binds = bwrap.worker_binds(submission=root, package=Path(grader.__file__).resolve().parent,
                                       scratch=cwd, triton_cache=cache_dir)
            argv, env = box.command(argv, binds=binds, env=env, cwd=home), {}
        rss = settings.memory_mb * MB if settings.memory_mb else None
        try:
            self.process = processes.Process(argv, cwd=str(cwd), env=env, rss_limit_bytes=rss,
                                             output_cap=settings.output_cap, pass_fds=(req_r, rep_w, *gate_fds),
                                             pid_namespace=box is not None)
        except BaseException:
            if self.gate is not None:
                self.gate.close()
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        if self.gate is not None:
            self.gate.name += f" (pid {self.process.pid})"
            self.gate.started()
        self._replies: queue.Queue = queue.Queue()
        self._writes: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()
        self.outcome: processes.Outcome | None = None

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
                    self._replies.put(protocol.decode(record, extra_fields=self.extra_fields))
                except protocol.ProtocolError as exc:
                    self._replies.put(exc)
                    return

    def _write(self) -> None:
        while (record := self._writes.get()) is not None:
            try:
                channel.write_record(self._req_w, record)
            except OSError:  # the worker is gone: its reply queue says how
                break
        with contextlib.suppress(OSError):
            os.close(self._req_w)

    def send(self, message) -> None:
        self._writes.put(protocol.encode(message))

    def waited(self) -> float:
        """Seconds this worker has spent waiting for the GPU (another process had it alone): not its own."""
        return self.gate.waiting_now() if self.gate is not None else 0.0

    def receive(self, deadline: float, limit_text: str):
        """The next reply; raises _Ended if the worker ends, sends garbage, or misses ``deadline`` (moved on by
        the time it waits for the GPU meanwhile)."""
        waited = self.waited()
        while True:
            left = deadline + self.waited() - waited - time.monotonic()
            if left > 0:
                try:
                    reply = self._replies.get(timeout=min(left, 1.0) if self.gate is not None else left)
                    break
                except queue.Empty:
                    continue
            outcome = self.stop(timed_out=True)
            raise _Ended(limit_text, outcome) from None
        if isinstance(reply, Exception):
            outcome = self.stop()
            raise _Ended(f"the worker sent a malformed result: {reply}", outcome)
        if reply is None:  # the worker closed its channel: it exited or was killed
            self.process.wait(5.0)
            outcome = self.stop()
            raise _Ended(_why_ended(outcome, self.settings), outcome)
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


def _why_ended(outcome: processes.Outcome, settings: RunSettings) -> str:
    if outcome.returncode == 1 and "Timeout (" in outcome.stderr.text():  # the worker's own watchdog
        return f"took longer than the {settings.call_timeout_s:g} s allowed for one call (stopped)"
    if outcome.timed_out:
        return f"timed out after {settings.timeout_s:g} s (stopped, with every process it started)"
    if outcome.memory_exceeded:
        return f"used more than {settings.memory_mb} MB of memory (stopped, with every process it started)"
    if outcome.signal_name:
        return f"crashed with {outcome.signal_name}"
    return f"exited early (exit code {outcome.returncode})"


def _stderr_tail(outcome: processes.Outcome, grader_dir: str) -> str:
    """The end of the worker's stderr without the grader's own frames (a faulthandler dump keeps the
    student's frames and the "Fatal Python error" line)."""
    lines = [line for line in outcome.stderr.text().rstrip().splitlines()
             if line.strip() and not line.startswith(_NOISE) and grader_dir not in line]
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def _log_text(outcome: processes.Outcome, attempt: int) -> str:
    head = f"--- worker run {attempt + 1}: {outcome.elapsed_s:.1f} s"
    if outcome.leftover_killed:
        head += f"; killed {outcome.leftover_killed} process(es) it left running"
    return f"{head}\n[stdout]\n{outcome.stdout.text()}\n[stderr]\n{outcome.stderr.text()}"


def describe(item: Item | None, exercise: Exercise) -> str:
    if item is None:
        return f"importing {exercise.module}.py"
    what = {"example": "example case", "random": "random case", "integrity": "integrity case",
            "fresh": "fresh-input case", "bad_input": "bad-input check", "speed": "speed measurement"}
    text = f"running the {item.part.name} {what.get(item.role, item.role + ' check')}"
    return text + (f" {item.case.label}" if item.case is not None else "")


def _request(item: Item, references: CaseReferences | None) -> protocol.Request:
    def inputs(case):
        return item.part.make_inputs(case) if references is None else references.inputs(item.part, case)

    if item.role == "bad_input":
        return protocol.RunBadInput(item.id, item.part.name, int(item.index or 0))
    if item.role == "speed":
        recheck = inputs(item.recheck) if item.recheck is not None else None
        return protocol.RunSpeed(item.id, item.part.name, item.budget_s, recheck)
    if item.case is None:
        return protocol.RunExtra(item.id, item.part.name, item.role)
    return protocol.RunCase(item.id, item.part.name, inputs(item.case), item.full)


def _not_implemented(reply: protocol.ItemReply) -> str | None:
    if isinstance(reply, protocol.NotImplementedYet):
        return reply.message
    if isinstance(reply, protocol.CaseDone) and reply.execution.error_kind == "not_implemented":
        return reply.execution.error or ""
    return None


def run(exercise: Exercise, root: Path, items: list[Item], settings: RunSettings, *, scratch: Path,
        cache_dir: Path | None = None,
        on_reply: Callable[[Item, protocol.Request, protocol.ItemReply], None] | None = None,
        arbiter: GpuArbiter | None = None,
        defer_speed: bool = False, references: CaseReferences | None = None) -> Run:
    """Run ``items`` (the skipped ones excepted) and return every reply, or why there is none. ``on_reply``
    sees each item's request and reply while the worker runs the next item. ``arbiter``: the GPU's, when exercise
    runs share it (each worker is connected to it; time a worker waits for the GPU is added to its limits).
    ``defer_speed``: a speed item's reply (its
    recorded launches) is not given to ``on_reply`` but kept in :attr:`Run.to_time`, for the trusted timer to time
    once every worker of the student's has ended. ``references``: where the cases' inputs come from (the batch's
    store)."""
    result = Run()
    deadline = time.monotonic() + settings.timeout_s
    extra_fields = {it.id: dict(x.fields) for it in items for x in it.part.extra_checks if x.name == it.role}
    seen_root, grader_dir = worker_view(settings, root)
    remaining = [it for it in items if it.skip_reason is None]
    not_implemented: dict[str, str] = {}  # part.missing_key -> message
    first_calls: set[str] = set()  # parts whose first call was made (it compiles: profiled apart)
    attempt = 0
    judge_next: list[tuple[Item, protocol.Request, protocol.ItemReply]] = []

    def judge_pending() -> None:
        while judge_next:
            item, request, reply = judge_next.pop(0)
            if on_reply is not None:
                start = time.monotonic()
                on_reply(item, request, reply)
                result.add_time("judge (grader)", time.monotonic() - start)

    crashes: dict[str, int] = {}  # part -> workers it crashed or left broken
    poisoned: list[str] = []  # set by ask(): the worker said its CUDA context is broken

    def ask(worker: _Worker, request: protocol.Request, item: Item):
        """Send one request of ``item`` and wait for its reply; the reply's id must be the item's. Time the worker
        spends waiting for the GPU is not the student's: the limits move on by as much."""
        nonlocal deadline
        waited = worker.waited()
        worker.send(request)
        judge_pending()  # judge the previous reply while the worker runs this request
        budget = request.budget_s if isinstance(request, protocol.RunSpeed) else 0.0
        call_text = f"took longer than the {settings.call_timeout_s + budget:g} s allowed for one call (stopped)"
        call_deadline = time.monotonic() + settings.call_timeout_s + budget + GRACE_S
        text = call_text if call_deadline < deadline else limit
        try:
            reply = worker.receive(min(deadline, call_deadline), text)
            if isinstance(reply, protocol.Poisoned):  # the request's own reply follows
                poisoned.append(reply.why)
                reply = worker.receive(min(deadline, call_deadline), text)
        finally:
            deadline += worker.waited() - waited
        if getattr(reply, "id", None) != item.id:
            raise _Ended(f"the worker sent a malformed result: a reply for {getattr(reply, 'id', '?')!r} "
                         f"while running {item.id!r}")
        return reply

    limit = f"timed out after {settings.timeout_s:g} s (stopped, with every process it started)"
    while remaining:
        if deadline - time.monotonic() <= 0.5:
            for it in remaining:
                result.failed.setdefault(it.id, f"not run: the {settings.timeout_s:g} s time limit was used up")
            break
        started = time.monotonic()
        worker = _Worker(settings, root, scratch, cache_dir, extra_fields, arbiter)
        poisoned.clear()
        current: Item | None = None
        progress = 0
        try:
            hello_by = min(deadline, time.monotonic() + settings.call_timeout_s + GRACE_S)
            try:
                worker.receive(hello_by, limit)  # Hello
            except _Ended as ended:
                outcome = ended.outcome or worker.stop()
                if outcome.timed_out and hello_by >= deadline:  # the exercise's time, used by the student's code
                    raise
                raise WorkerStartError(f"the worker did not start ({ended.why}):\n"
                                       f"{outcome.stderr.text()[-2000:]}") from None
            result.add_time("worker start", time.monotonic() - started)
            loading, waited = time.monotonic(), worker.waited()
            worker.send(protocol.Job(exercise.name, seen_root, settings.device, settings.call_timeout_s))
            loaded = worker.receive(min(deadline, time.monotonic() + settings.call_timeout_s + GRACE_S), limit)
            deadline += worker.waited() - waited
            if not isinstance(loaded, protocol.Loaded):
                raise _Ended("the worker sent a malformed result: expected the loaded message")
            result.add_time("import the module", time.monotonic() - loading)
            result.loaded = True
            result.load_errors = dict(loaded.errors)
            queue_ = list(remaining)
            while queue_:
                item = queue_.pop(0)
                if item.part.name in result.load_errors:
                    result.not_run[item.id] = "the module did not load"
                    continue
                if item.part.missing_key in not_implemented:
                    result.not_run[item.id] = f"not implemented: {not_implemented[item.part.missing_key]}"
                    continue
                request = _request(item, references)
                current, sent = item, time.monotonic()
                if isinstance(request, protocol.RunSpeed):  # compile every candidate first; then autotune and record
                    warmed = ask(worker, protocol.WarmUp(item.id, item.part.name), item)
                    if not isinstance(warmed, protocol.WarmedUp | protocol.Raised | protocol.NotImplementedYet):
                        raise _Ended(f"the worker sent a malformed result: {type(warmed).__name__} to a warm-up")
                    result.add_time("speed: warm-up (compiles)", time.monotonic() - sent)
                    if poisoned:  # the worker exits: the speed measurement is what broke it
                        current = None
                        why = f"the speed warm-up left the CUDA context broken ({poisoned.pop()})"
                        result.failed[item.id] = why
                        crashes[item.part.name] = crashes.get(item.part.name, 0) + 1
                        raise _Ended(f"{describe(item, exercise)}: {why}; the checks after it ran in a fresh worker",
                                     broken_context=True)
                    sent = time.monotonic()
                reply = ask(worker, request, item)
                first_call = item.part.name not in first_calls and item.role != "bad_input"
                first_calls.add(item.part.name)
                result.add_time("first call of each part (compiles its kernels)" if first_call else _step(item),
                                time.monotonic() - sent)
                current = None
                result.replies[item.id] = reply
                progress += 1
                message = _not_implemented(reply)
                if message is not None:
                    not_implemented.setdefault(item.part.missing_key, message)
                if defer_speed and isinstance(reply, protocol.SpeedDone):
                    result.to_time.append((item, request, reply))
                else:
                    judge_next.append((item, request, reply))
                if poisoned:  # the worker exits: the next items run in a fresh one
                    crashes[item.part.name] = crashes.get(item.part.name, 0) + 1
                    raise _Ended(f"{describe(item, exercise)} left the CUDA context broken ({poisoned.pop()}); the "
                                 "checks after it ran in a fresh worker", broken_context=True)
            remaining = []
            outcome = worker.finish()
            result.logs.append(_log_text(outcome, attempt))
        except _Ended as ended:
            outcome = ended.outcome or worker.stop()
            result.logs.append(_log_text(outcome, attempt))
            where = describe(current, exercise) if (current or not result.loaded) else "between checks"
            message = ended.why if ended.broken_context else f"{ended.why} while {where}"
            tail = _stderr_tail(outcome, grader_dir)
            if tail and not outcome.timed_out and attempt == 0:  # restarts usually repeat the same story
                label = "where it was" if "took longer" in ended.why else "last lines of its stderr"
                message += f"\n{label}:\n{tail}"
            result.problems.append(message)
            if current is not None:
                result.failed[current.id] = message
                crashes[current.part.name] = crashes.get(current.part.name, 0) + 1
            done = set(result.replies) | set(result.failed) | set(result.not_run)
            pending = [it for it in remaining if it.id not in done]
            # Restart for the items not reached, while the restarts make progress. A part whose calls crashed
            # (or broke the CUDA context) more than max_restarts workers, or crashed a fresh one on its first
            # call, runs no more items — code that crashes on every call is not run over and over — but the
            # other parts go on: a crash costs its own checks only.
            to_blame = current.part.name if current is not None else None
            stuck = attempt > 0 and progress == 0
            fatal = not result.loaded or "malformed" in ended.why or time.monotonic() >= deadline - 0.5
            spent = {name for name, n in crashes.items() if n > settings.max_restarts}
            if stuck and to_blame is not None:
                spent.add(to_blame)
            if fatal or (stuck and to_blame is None) or attempt >= settings.max_restarts * len(exercise.parts) + 1:
                spent = {it.part.name for it in pending}
            for it in pending:
                if it.part.name in spent:
                    result.failed.setdefault(it.id, f"not run: {message.splitlines()[0]}")
            remaining = [it for it in pending if it.part.name not in spent]
            attempt += 1
        finally:
            worker.stop()
    judge_pending()
    return result


def _step(item: Item) -> str:
    return {"example": "examples", "random": "random cases", "integrity": "integrity", "fresh": "integrity",
            "bad_input": "bad inputs", "speed": "speed"}.get(item.role, f"{item.role} check")
