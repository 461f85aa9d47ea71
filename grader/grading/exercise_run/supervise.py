"""Run a planned exercise in sandboxed workers, one item at a time.

The grader starts a worker (:mod:`grader.grading.isolation.worker`) in a sandbox
(:mod:`grader.grading.isolation.bwrap`; in its own process group only, where the instructor opted out of the
sandbox) with two pipes of its own, sends the job, then one request per item and waits for the reply, within
a limit per call (the ``call_timeout_s``, plus the timing budget for speed) and for the whole exercise
(``timeout_s``). While the worker runs an item, the grader builds the next item's request, so that it goes out as
soon as the reply comes (every request is built by :mod:`.item_requests`); replies are judged (``on_reply``) in
order on a thread of their own (:mod:`.judging_thread`), so that judging (a float64 reference computed, or awaited
from another run of the batch that is computing it) never keeps the worker waiting. What the workers did comes
back as a :class:`~.supervised_run.Run`.

A fault costs only its own check. An exception, ``NotImplementedError`` included, is that item's reply and the
next item runs. A worker that crashes or overruns a call's limit is stopped (with every process it started), the
item it was running fails with the reason, and a fresh worker goes on with the items not reached, for as long as
the exercise's time allows: there is no count of crashes after which the rest is lost. After a crash the items of
other kinds go first (an extra check such as the memory check, the integrity cases, the bad inputs), so that a
kind of check that crashes on every call cannot use up the time of the others. A worker whose CUDA context an
item left broken says so and exits: that item keeps its own result and a fresh worker runs the rest. A crash
while importing the module (in every worker), a malformed message and the exercise's time limit end the run.

On a GPU every worker is connected to the GPU's arbiter (:mod:`grader.grading.isolation.gpu_arbiter`): the workers share
the GPU, and one that autotunes asks for it alone, as the trusted timer does for its timed rounds; a worker paused
meanwhile goes on compiling, and the time it waits for the GPU is added to its limits. A speed item compiles its
benchmarks' kernels first (``WarmUp``), then autotunes and records them (``RunSpeed``). With
``settings.compile_ahead`` (a GPU whose host has cores to spare), a worker is first sent its cases' and benchmarks'
inputs without values (``CompileAhead``: shapes, dtypes and strides) and compiles their kernels at once
(:mod:`grader.checks.compile_ahead`); a worker that ends meanwhile costs the student nothing: a fresh one runs the
checks without it, and the exercise's time limit moves on by the time lost. A worker that
ends, or does not start within a call's limit, before it says hello ran no student code: that is the grader's
fault (:class:`WorkerStartError`), never the student's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading.config import RunSettings
from grader.grading.exercise_run import workers
from grader.grading.exercise_run.case_references import CaseReferences
from grader.grading.exercise_run.item_plan import Item
from grader.grading.exercise_run.item_requests import ahead_requests, describe, request_for
from grader.grading.exercise_run.judging_thread import JudgingThread
from grader.grading.exercise_run.supervised_run import Run
from grader.grading.exercise_run.workers import GRACE_S  # noqa: F401 - part of this module's interface
from grader.grading.isolation import protocol
from grader.grading.isolation.gpu_arbiter import GpuArbiter


class WorkerStartError(RuntimeError):
    """The worker ended before it ran anything of the student's: the sandbox or the environment is broken."""


class _AheadEnded(Exception):
    """The worker ended while compiling ahead: a fresh one runs the items, without compiling ahead."""

    def __init__(self, why: str, ended: workers.Ended | None = None):
        super().__init__(why)
        self.ended = ended


IDLE = "worker idle (waiting for the grader's next request)"
COMPILING_AHEAD = "compiling ahead (the cases' kernels, at once)"
COMPILING_BENCHMARKS_AHEAD = "compiling ahead (the benchmarks' kernels and autotuning candidates, at once)"
LONG_COMPILE = 0.25  # a compilation this much of a call's limit or longer is told in the report
CUT_SHORT = "a request cut short, or the exit"  # CPU after a worker's last reply (a crash, a time-out)
# What a request has a worker run, in the profile's words.
DOING = {protocol.RunCase: "a case", protocol.RunBadInput: "a bad input", protocol.RunExtra: "an extra check",
         protocol.WarmUp: "the speed warm-up", protocol.RunSpeed: "the speed recording",
         protocol.CompileAhead: "compiling ahead"}


def run(exercise: Exercise, root: Path, items: list[Item], settings: RunSettings, *, scratch: Path,
        cache_dir: Path | None = None,
        on_reply: Callable[[Item, protocol.Request, protocol.ItemReply], None] | None = None,
        arbiter: GpuArbiter | None = None,
        defer_speed: bool = False, references: CaseReferences | None = None,
        on_recorded: Callable[[Item, protocol.Request, protocol.ItemReply], None] | None = None) -> Run:
    """Run ``items`` (the skipped ones excepted) and return every reply, or why there is none. ``on_reply``
    sees each item's request and reply, in order, on a thread of its own while the worker runs the next items.
    ``arbiter``: the GPU's, when exercise runs share it (each worker is connected to it; time a worker waits for
    the GPU is added to its limits).
    ``defer_speed``: a speed item's reply (its recorded launches) is not given to ``on_reply`` but kept in
    :attr:`Run.to_time`, for the trusted timer to time once every worker of the student's has ended.
    ``on_recorded`` sees every speed item's reply (a recording or why there is none) on ``on_reply``'s thread, after
    the replies before it: what can be judged before the timing is judged meanwhile.
    ``references``: where the cases' inputs come from (the batch's store)."""
    supervision = _Supervision(exercise, root, settings, scratch=scratch, cache_dir=cache_dir, on_reply=on_reply,
                               arbiter=arbiter, defer_speed=defer_speed, references=references, items=items,
                               on_recorded=on_recorded)
    return supervision.run([it for it in items if it.skip_reason is None])


class _Supervision:
    """One :func:`run`: its workers one after another, each going on with the items the last did not reach."""

    def __init__(self, exercise: Exercise, root: Path, settings: RunSettings, *, scratch: Path,
                 cache_dir: Path | None, on_reply, arbiter: GpuArbiter | None, defer_speed: bool,
                 references: CaseReferences | None, items: list[Item], on_recorded=None):
        self.exercise, self.root, self.settings = exercise, root, settings
        self.scratch, self.cache_dir, self.on_reply, self.arbiter = scratch, cache_dir, on_reply, arbiter
        self.defer_speed, self.references, self.on_recorded = defer_speed, references, on_recorded
        self.result = Run()
        self.deadline = time.monotonic() + settings.timeout_s
        self.extra_fields = {it.id: dict(x.fields) for it in items for x in it.part.extra_checks if x.name == it.role}
        self.seen_root, self.grader_dir = workers.worker_view(settings, root)
        self.first_calls: set[str] = set()  # parts whose first call was made (it compiles: profiled apart)
        self.judging: JudgingThread | None = None  # while run() runs, where on_reply is given
        self.upcoming: list[Item] = []  # the items after the current one
        self.prepared: dict[str, protocol.Request] = {}  # the next item's request, built while the worker ran
        self.poisoned: list[str] = []  # set by ask(): the worker said its CUDA context is broken
        self.limit = f"timed out after {settings.timeout_s:g} s (stopped, with every process it started)"
        self.current: Item | None = None  # the item the worker is running
        self.progress = 0  # items the current worker answered
        self.cpu_mark = 0.0  # the current worker's CPU seconds when its last step ended
        self.ahead = settings.compile_ahead  # compile the cases' kernels at once first
        self.compile_used = 0.0  # seconds of compiling the limits moved on by, over this run's workers

    def run(self, remaining: list[Item]) -> Run:
        if self.on_reply is not None:
            self.judging = JudgingThread(self.on_reply, f"judge {self.scratch.name}")
        try:
            self._run(remaining)
        finally:
            if self.judging is not None:
                judging, self.judging = self.judging, None
                try:
                    judging.close()
                finally:
                    self.result.add_time("judge (grader)", judging.seconds)
        return self.result

    def _run(self, remaining: list[Item]) -> None:
        result, settings = self.result, self.settings
        attempt = 0
        while remaining:
            if self.deadline - time.monotonic() <= 0.5:
                for it in remaining:
                    result.failed.setdefault(it.id, f"not run: the {settings.timeout_s:g} s time limit was used up")
                break
            born, deadline_then = time.monotonic(), self.deadline
            worker = workers.Worker(settings, self.root, self.scratch, self.cache_dir, self.extra_fields,
                                    self.arbiter, compile_allowance_s=max(0.0, settings.timeout_s - self.compile_used))
            self.poisoned.clear()
            self.current, self.progress, self.cpu_mark = None, 0, 0.0
            try:
                self.upcoming = list(remaining)
                self._prepare_next()  # the first request, built while the worker starts
                self._start(worker)
                self._compile_ahead(worker)
                self._run_items(worker)
                remaining = []
                result.logs.append(workers.log_text(worker.finish(), attempt))
            except _AheadEnded as ahead:  # the same items, in a fresh worker; its whole life is not the student's
                self.deadline = deadline_then + (time.monotonic() - born)
                outcome = ahead.ended.outcome if ahead.ended is not None and ahead.ended.outcome else worker.stop()
                result.logs.append(f"{workers.log_text(outcome, attempt)}\n[the grader] {ahead}: the worker ended "
                                   "while compiling ahead; a fresh one ran the checks, without compiling ahead")
            except workers.Ended as ended:
                remaining = self._after_end(worker, ended, remaining, attempt)
                attempt += 1
            finally:
                worker.stop()
                if (rest := worker.process.cpu_s() - self.cpu_mark) > 0:
                    result.add_cpu(CUT_SHORT, rest)
                self._compiled(worker)

    def _start(self, worker: workers.Worker) -> None:
        """Wait for the worker's hello, then have it import the student's module."""
        result, settings = self.result, self.settings
        started = time.monotonic()
        hello_by = min(self.deadline, time.monotonic() + settings.call_timeout_s + workers.GRACE_S)
        try:
            worker.receive(hello_by, self.limit)  # Hello
        except workers.Ended as ended:
            outcome = ended.outcome or worker.stop()
            if outcome.timed_out and hello_by >= self.deadline:  # the exercise's time, used by the student's code
                raise
            raise WorkerStartError(f"the worker did not start ({ended.why}):\n"
                                   f"{outcome.stderr.text()[-2000:]}") from None
        self._spent(worker, "worker start", started)
        loading, waited = time.monotonic(), worker.waited()
        worker.send(protocol.Job(self.exercise.name, self.seen_root, settings.device, settings.call_timeout_s),
                    doing="importing the module")
        loaded = worker.receive(min(self.deadline, time.monotonic() + settings.call_timeout_s + workers.GRACE_S),
                                self.limit)
        self.deadline += worker.waited() - waited
        if not isinstance(loaded, protocol.Loaded):
            raise workers.Ended("the worker sent a malformed result: expected the loaded message", malformed=True)
        self._spent(worker, "import the module", loading)
        result.loaded = True
        result.load_errors = dict(loaded.errors)

    def _compile_ahead(self, worker: workers.Worker) -> None:
        """Have the worker compile the kernels of its upcoming cases and benchmarks (:func:`ahead_requests`);
        raises :class:`_AheadEnded` where the worker ended meanwhile (it is not run again: the student loses
        nothing, and the exercise's time limit moves on by the worker's whole life)."""
        if not self.ahead:
            return
        for request in ahead_requests(self.upcoming, self.result.load_errors):
            part, started = request.part, time.monotonic()
            reply, ended = None, None
            try:
                reply = self._ask(worker, request, request.id)
            except workers.Ended as exc:
                if exc.malformed:  # as for any other request: the run ends
                    raise
                ended = exc
            self._spent(worker, COMPILING_BENCHMARKS_AHEAD if request.benchmarks else COMPILING_AHEAD, started)
            if ended is not None or self.poisoned or not isinstance(reply, protocol.CompiledAhead | protocol.Raised):
                self.ahead = False
                why = f"{part}: {ended.why if ended else self.poisoned[0] if self.poisoned else type(reply).__name__}"
                self.poisoned.clear()
                raise _AheadEnded(why, ended)

    def _run_items(self, worker: workers.Worker) -> None:
        """Run :attr:`upcoming`, one item at a time."""
        result = self.result
        while self.upcoming:
            item = self.upcoming.pop(0)
            if item.part.name in result.load_errors:
                result.not_run[item.id] = "the module did not load"
                continue
            request = self.prepared.pop(item.id, None) or request_for(item, self.references)
            self.current, sent = item, time.monotonic()
            if isinstance(request, protocol.RunSpeed):  # compile every candidate first; then autotune and record
                self._warm_up(worker, item, sent)
                sent = time.monotonic()
            reply = self._ask(worker, request, item.id)
            first_call = item.part.name not in self.first_calls and item.role not in ("bad_input", "speed")
            if item.role != "speed":  # compiles apart, with its warm-up
                self.first_calls.add(item.part.name)
            self._spent(worker, "first call of each part (compiles its kernels)" if first_call else _step(item), sent)
            self.current = None
            result.replies[item.id] = reply
            self.progress += 1
            self._deliver(item, request, reply)
            if self.poisoned:  # the worker exits: the next items run in a fresh one
                raise workers.Ended(f"{describe(item, self.exercise)} left the CUDA context broken "
                                    f"({self.poisoned.pop()}); the checks after it ran in a fresh worker",
                                    broken_context=True)

    def _deliver(self, item: Item, request: protocol.Request, reply: protocol.ItemReply) -> None:
        """Hand a reply to the judging thread: to ``on_reply``, except a speed measurement to time later
        (``defer_speed``), kept in :attr:`Run.to_time`. Every speed item's reply also goes to ``on_recorded``
        after it: a recording, or the reply that says there is none."""
        deferred = self.defer_speed and isinstance(reply, protocol.SpeedDone)
        if deferred:
            self.result.to_time.append((item, request, reply))
        if self.judging is None:
            return
        if not deferred:
            self.judging.put(item, request, reply)
        if item.role == "speed" and self.on_recorded is not None:
            self.judging.put(item, request, reply, judge=self.on_recorded)

    def _warm_up(self, worker: workers.Worker, item: Item, sent: float) -> None:
        warmed = self._ask(worker, protocol.WarmUp(item.id, item.part.name), item.id)
        if not isinstance(warmed, protocol.WarmedUp | protocol.Raised | protocol.NotImplementedYet):
            raise workers.Ended(f"the worker sent a malformed result: {type(warmed).__name__} to a warm-up",
                                malformed=True)
        self._spent(worker, "speed: warm-up (compiles)", sent)
        if self.poisoned:  # the worker exits: the speed measurement is what broke it
            self.current = None
            why = f"the speed warm-up left the CUDA context broken ({self.poisoned.pop()})"
            self.result.failed[item.id] = why
            raise workers.Ended(f"{describe(item, self.exercise)}: {why}; the checks after it ran in a fresh worker",
                                broken_context=True)

    def _compiled(self, worker: workers.Worker) -> None:
        """Count what ``worker`` spent compiling, and tell the student of each long compilation: it is not counted in
        a call's time limit, and a time-out elsewhere is easier to read knowing it."""
        self.compile_used += min(worker.compiling_s(), worker.compile_allowance_s)
        call_limit = self.settings.call_timeout_s
        for what, seconds in worker.compilations:
            if seconds >= LONG_COMPILE * call_limit:
                note = (f"compiling {what} took {seconds:.0f} s; compiling is not counted in the {call_limit:g} s "
                        f"limit of a call (one compilation may take up to {self.settings.compile_timeout_s:g} s)")
                if note not in self.result.notes:
                    self.result.notes.append(note)

    def _spent(self, worker: workers.Worker, step: str, since: float) -> None:
        """``step`` ended now: its wall time since ``since``, and the worker's CPU time since the last step's end."""
        self.result.add_time(step, time.monotonic() - since)
        cpu = worker.process.cpu_s()
        self.result.add_cpu(step, max(0.0, cpu - self.cpu_mark))
        self.cpu_mark = max(self.cpu_mark, cpu)

    def _ask(self, worker: workers.Worker, request: protocol.Request, item_id: str):
        """Send one request and wait for its reply; the reply's id must be ``item_id``. Time the worker
        spends waiting for the GPU is not the student's: the limits move on by as much."""
        settings = self.settings
        waited = worker.waited()
        if worker.replied_at is not None:  # since its last reply it has waited for this request
            self.result.add_time(IDLE, time.monotonic() - worker.replied_at)
        worker.send(request, doing=DOING.get(type(request), type(request).__name__))
        self._prepare_next()
        budget = request.budget_s if isinstance(request, protocol.RunSpeed) else 0.0
        call_text = f"took longer than the {settings.call_timeout_s + budget:g} s allowed for one call (stopped)"
        call_deadline = time.monotonic() + settings.call_timeout_s + budget + workers.GRACE_S
        text = call_text if call_deadline < self.deadline else self.limit
        try:
            reply = worker.receive(min(self.deadline, call_deadline), text)
            if isinstance(reply, protocol.Poisoned):  # the request's own reply follows
                self.poisoned.append(reply.why)
                reply = worker.receive(min(self.deadline, call_deadline), text)
        finally:
            self.deadline += worker.waited() - waited
        if getattr(reply, "id", None) != item_id:
            raise workers.Ended(f"the worker sent a malformed result: a reply for {getattr(reply, 'id', '?')!r} "
                                f"while running {item_id!r}", malformed=True)
        return reply

    def _prepare_next(self) -> None:
        """Build the next item's request while the worker runs this one (its inputs: loaded from the batch's store,
        or drawn). A failure is left for the item's turn, which builds it again and fails there."""
        if not self.upcoming or self.upcoming[0].id in self.prepared:
            return
        following = self.upcoming[0]
        try:
            self.prepared = {following.id: request_for(following, self.references)}
        except Exception:
            self.prepared = {}

    def _after_end(self, worker: workers.Worker, ended: workers.Ended, remaining: list[Item],
                   attempt: int) -> list[Item]:
        """Record why the worker ended and charge the item it was running; return the items a fresh worker runs."""
        result, current = self.result, self.current
        outcome = ended.outcome or worker.stop()
        result.logs.append(workers.log_text(outcome, attempt))
        where = describe(current, self.exercise) if (current or not result.loaded) else "between checks"
        message = ended.why if ended.broken_context else f"{ended.why} while {where}"
        tail = workers.stderr_tail(outcome, self.grader_dir)
        if tail and not outcome.timed_out and attempt == 0:  # restarts usually repeat the same story
            label = "where it was" if "took longer" in ended.why else "last lines of its stderr"
            message += f"\n{label}:\n{tail}"
        result.problems.append(message)
        if current is not None:
            result.failed[current.id] = message
        done = set(result.replies) | set(result.failed) | set(result.not_run)
        pending = [it for it in remaining if it.id not in done]
        # A fresh worker goes on with the items not reached, while the exercise has time; a worker that ends
        # before its first item (importing the module again) has nothing to blame but the module: the run ends.
        fatal = (not result.loaded or ended.malformed or time.monotonic() >= self.deadline - 0.5
                 or (current is None and self.progress == 0 and attempt > 0))
        if fatal:
            for it in pending:
                result.failed.setdefault(it.id, f"not run: {message.splitlines()[0]}")
            return []
        return after_crash(pending, current)


def after_crash(pending: list[Item], crashed: Item | None) -> list[Item]:
    """The order a fresh worker runs ``pending`` in after ``crashed`` ended a worker: the items of its part and kind
    last (in their order), so that every other kind of check runs before that kind can crash again."""
    if crashed is None:
        return pending
    same = [it for it in pending if it.part is crashed.part and it.kind == crashed.kind]
    return [it for it in pending if it not in same] + same

def _step(item: Item) -> str:
    return {"example": "examples", "random": "random cases", "integrity": "integrity", "fresh": "integrity",
            "bad_input": "bad inputs", "speed": "speed"}.get(item.role, f"{item.role} check")
