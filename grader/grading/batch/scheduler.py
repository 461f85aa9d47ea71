"""Run a batch's tasks — one (student, exercise) each — on local slots (:mod:`grader.grading.exercise_run.slots`): CPU
worker places, or GPUs.

* Longest work first (each task carries an estimate), so the batch ends evenly.
* Each slot runs ``capacity`` tasks at once (one by default: one worker per GPU). A task whose workers have all
  ended (:attr:`Task.workers_ended`) and that only waits for its trusted timer's turn and the credit gives its
  place to the next task: a slot runs up to ``TAIL_RUNS_PER_PLACE * capacity`` tasks at once, at most
  ``capacity`` of them with workers.
* A result is handed to ``commit`` the moment it is judged; commits are serialized, and none happens
  after :meth:`Scheduler.stop` (a batch being stopped records nothing its killed workers return).
* After a run that went wrong on a GPU (a crash, an error, a grader fault), ``probe`` asks whether the GPU
  itself still works. If not, the slot is taken out of the pool and the task runs again on another
  GPU; its result then names the GPU that failed (``ExerciseResult.device["replaces"]``). A task whose
  GPUs keep failing under it is recorded as "needs regrade" after ``max_failovers`` moves; tasks left
  when every GPU has failed are returned, not graded.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from grader.checks.spec import Exercise
from grader.grading.batch.submission import Submission
from grader.grading.exercise_run.judging import GRADER_FAULT, grader_error
from grader.grading.exercise_run.slots import Slot
from grader.grading.results.results import ERROR, NEEDS_REGRADE, ExerciseResult, GraderError, PartResult, SpeedResult

ITEM_S = 1.0  # rough cost of one correctness item (worker round trip, reference) for the estimate
BENCHMARK_S = 5.0  # compiling and warming up one benchmark, on top of the timing budget
# Tasks a slot runs at once for each of its places: the others wait only for their trusted timer (its turn alone
# and the timed rounds) and their credit, which take none of the host's cores and little of the GPU's memory.
TAIL_RUNS_PER_PLACE = 2


def task_key(student: str, exercise: str) -> str:
    """A task's name: its student and exercise (the progress line's key)."""
    return f"{student} {exercise}"


@dataclass
class Task:
    student: str
    exercise: Exercise
    submission: Submission
    previous: ExerciseResult | None = None  # set for a regrade of some parts
    estimate_s: float = 0.0
    failed_on: list[str] = field(default_factory=list)  # GPUs that failed under it, with why
    # Called by the run once the student's workers have ended (set by the scheduler): the next task may start.
    workers_ended: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)

    @property
    def key(self) -> str:
        return task_key(self.student, self.exercise.name)


@dataclass
class GpuFailure:
    slot: str
    device: Mapping
    reason: str
    task: str
    when: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))

    def to_dict(self) -> dict:
        return {"slot": self.slot, "device": dict(self.device), "reason": self.reason, "task": self.task,
                "when": self.when}


@dataclass
class Outcome:
    committed: int = 0
    failures: list[GpuFailure] = field(default_factory=list)
    left: list[Task] = field(default_factory=list)  # not graded: no usable slot was left


def static_estimate(exercise: Exercise, *, device: str, random_cases: int, speed_budget_s: float) -> float:
    """Seconds an exercise should take, from what its spec declares (items, benchmarks, timing budget)."""
    total = 0.0
    for part in exercise.parts:
        items = (len(part.examples) + random_cases + len(part.integrity_examples) + 1 + len(part.bad_inputs)
                 + len(part.extra_checks))
        total += items * ITEM_S
        if device == "cuda" and part.speed_graded:
            total += speed_budget_s + BENCHMARK_S * len(part.benchmarks)
    return total


def estimate(exercise: Exercise, previous: ExerciseResult | None, history: Mapping[str, list[float]],
             static: float) -> float:
    """The previous run of this task if there was one, else the median of this exercise's runs so far,
    else the spec's estimate."""
    if previous is not None and previous.elapsed_s > 0:
        return previous.elapsed_s
    seen = [s for s in history.get(exercise.name, []) if s > 0]
    return statistics.median(seen) if seen else static


NICE_SPAN = 10  # the niceness of the shortest work: a nice-10 process weighs a ninth of a nice-0 one in the kernel


def niceness(estimate_s: float, longest_s: float) -> int:
    """The CPU niceness of the workers of a run expected to take ``estimate_s``, in a batch whose longest run is
    expected to take ``longest_s``: 0 for the longest (its chain of compilations is the batch's critical path),
    rising in proportion to :data:`NICE_SPAN` for shorter ones. Where the host's cores are all busy, the long runs
    get them first; where cores are idle, niceness changes nothing. Trusted timers keep niceness 0."""
    if longest_s <= 0 or estimate_s >= longest_s:
        return 0
    return round(NICE_SPAN * (1.0 - max(0.0, estimate_s) / longest_s))


def suspicious(result: ExerciseResult) -> bool:
    """Did the run go wrong in a way a failing GPU could explain?"""
    return (result.status in (ERROR, NEEDS_REGRADE) or bool(result.problems)
            or any(p.status in (ERROR, NEEDS_REGRADE) for p in result.parts))


def gave_up(task: Task, last: ExerciseResult) -> ExerciseResult:
    """The result of a task whose GPUs kept failing: the grader's problem, regraded later."""
    why = "; ".join(task.failed_on)
    error = GraderError(f"{task.exercise.name} (GPU)", f"the GPU failed under this exercise {len(task.failed_on)} "
                        f"time(s): {why}")
    parts = [PartResult(p.name, NEEDS_REGRADE, GRADER_FAULT, speed=SpeedResult(NEEDS_REGRADE))
             for p in task.exercise.parts]
    return ExerciseResult(task.exercise.name, task.exercise.title, NEEDS_REGRADE, GRADER_FAULT, parts=parts,
                          grader_errors=[error], log=last.log, elapsed_s=last.elapsed_s, device=dict(last.device))


class Scheduler:
    """Runs tasks on ``slots``; see the module's docstring."""

    def __init__(self, slots: list[Slot], grade: Callable[[Task, Slot], ExerciseResult],
                 commit: Callable[[Task, ExerciseResult], None], *,
                 probe: Callable[[Slot], str | None] | None = None, max_failovers: int = 2,
                 on_failure: Callable[[GpuFailure], None] | None = None):
        if not slots:
            raise ValueError("no slot to run tasks on")
        self.slots = slots
        self._grade = grade
        self._commit = commit
        self._probe = probe
        self.max_failovers = max_failovers
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._commit_lock = threading.Lock()
        self._heap: list = []
        self._seq = itertools.count()
        self._in_flight = 0
        self._places = {slot.name: 0 for slot in slots}  # tasks of each slot whose workers may still run
        self._stopping = False
        self.outcome = Outcome()

    def _push(self, task: Task) -> None:
        heapq.heappush(self._heap, (-task.estimate_s, next(self._seq), task))

    def run(self, tasks: Iterable[Task]) -> Outcome:
        with self._cond:
            for task in tasks:
                self._push(task)
        threads = [threading.Thread(target=self._loop, args=(slot,), name=f"slot {slot.name}#{i}", daemon=True)
                   for slot in self.slots for i in range(TAIL_RUNS_PER_PLACE * max(1, slot.capacity))]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # a timed join: the main thread stays responsive to signals
        with self._cond:
            self.outcome.left = [entry[2] for entry in sorted(self._heap)]
        return self.outcome

    def stop(self) -> None:
        """Hand out no more tasks and commit nothing more (waits for a commit under way)."""
        with self._commit_lock:
            self._stopping = True
        with self._cond:
            self._cond.notify_all()

    def _next(self, slot: Slot) -> Task | None:
        with self._cond:
            while True:
                if self._stopping or slot.failed:
                    return None
                if self._heap and self._places[slot.name] < max(1, slot.capacity):
                    self._in_flight += 1
                    self._places[slot.name] += 1
                    task = heapq.heappop(self._heap)[2]
                    task.workers_ended = self._leaving(slot)
                    return task
                if self._in_flight == 0:
                    return None
                self._cond.wait()

    def _loop(self, slot: Slot) -> None:
        while (task := self._next(slot)) is not None:
            try:
                result = self._grade(task, slot)
            except Exception as exc:  # grade() records its own faults; this is the last resort
                result = ExerciseResult(task.exercise.name, task.exercise.title, NEEDS_REGRADE, GRADER_FAULT,
                                        grader_errors=[grader_error(task.exercise.name, exc)],
                                        device=dict(slot.device))
            fault = None
            if slot.is_gpu and self._probe is not None and not self._stopping and suspicious(result):
                fault = self._probe(slot)
            give_up = False
            with self._cond:
                self._in_flight -= 1
                if fault is not None:
                    self._take_out(slot, fault, task)
                    give_up = len(task.failed_on) > self.max_failovers
                    if not give_up:
                        self._push(task)  # again, elsewhere (or left, if no slot is usable any more)
                # Its place, if the run did not give it back earlier: only now that a failed GPU is marked so,
                # or the slot's next thread could take a task onto it in between.
                task.workers_ended()
                self._cond.notify_all()
            if fault is not None and not give_up:
                continue
            if give_up:
                result = gave_up(task, result)
            if task.failed_on:
                result.device = {**result.device, "replaces": list(task.failed_on)}
            with self._commit_lock:
                if self._stopping:
                    continue
                try:
                    self._commit(task, result)
                except Exception as exc:  # commit() records its own faults; the batch goes on regardless
                    print(f"grader: could not record {task.key}: {type(exc).__name__}: {exc} (it will be graded "
                          "again by the next run)", file=sys.stderr)
                    continue
                self.outcome.committed += 1

    def _leaving(self, slot: Slot) -> Callable[[], None]:
        """What gives a task's place on ``slot`` back to the next task, once (later calls do nothing)."""
        left = threading.Event()

        def leave() -> None:
            with self._cond:
                if left.is_set():
                    return
                left.set()
                self._places[slot.name] -= 1
                self._cond.notify_all()

        return leave

    def _take_out(self, slot: Slot, reason: str, task: Task) -> None:
        task.failed_on.append(f"{slot.describe()}: {reason}")
        if slot.failed is None:
            slot.failed = reason
            failure = GpuFailure(slot.name, dict(slot.device), reason, task.key)
            self.outcome.failures.append(failure)
            if self._on_failure is not None:
                self._on_failure(failure)
