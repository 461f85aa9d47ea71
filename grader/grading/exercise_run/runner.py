"""Grade one exercise of one implementation tree: plan the checks (:mod:`.item_plan`), run them in sandboxed workers
(:mod:`.supervise`) and judge the replies as they come (:mod:`.judging`). This is the grader's side: it never
imports student code.

Nothing the submission does makes :func:`grade_exercise` raise; a fault of the grader itself makes the
exercise "needs regrade", with the traceback kept for staff.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from grader.checks import loader
from grader.checks.spec import Exercise
from grader.grading.config import RunSettings
from grader.grading.exercise_run import (
    gpu_references,
    item_plan,
    references,
    supervise,
    timer_process,
    workers,
    yardstick_plans,
)
from grader.grading.exercise_run.case_references import CaseReferences
from grader.grading.exercise_run.judging import GRADER_FAULT, ExerciseJudge, grader_error
from grader.grading.exercise_run.slots import Slot
from grader.grading.exercise_run.supervised_run import Run
from grader.grading.isolation import protocol
from grader.grading.results.results import (
    ERROR,
    GRADED,
    NEEDS_REGRADE,
    NOT_IMPLEMENTED,
    NOT_SUBMITTED,
    ExerciseResult,
    PartResult,
    SpeedResult,
)
from grader.speed import credit, workload
from grader.speed.thresholds import speed_curves

TIMER_STEP = "speed: trusted timer"
CREDIT_STEP = "speed: judging the timed runs"


def grade_exercise(exercise: Exercise, root: Path, *, settings: RunSettings, scratch: Path,
                   cache_dir: Path | None = None, parts: tuple[str, ...] | None = None,
                   slot: Slot | None = None, on_workers_ended: Callable[[], None] | None = None) -> ExerciseResult:
    """Grade ``exercise`` of the tree ``root`` (only ``parts``, for a regrade) on ``slot``: its workers get
    the slot's environment (the GPU they are pinned to), and the result records the slot's device.
    ``on_workers_ended`` is called once every worker of the student's has ended, before the trusted timer times
    (the scheduler then starts the next run)."""
    start = time.monotonic()
    if slot is not None:
        settings = replace(settings, env={**settings.env, **slot.env}, gpu_name=slot.gpu_name or settings.gpu_name)
    device = dict(slot.device) if slot is not None else {"kind": settings.device}
    result = ExerciseResult(exercise.name, exercise.title, GRADED, device=device)
    selected = [p for p in exercise.parts if parts is None or p.name in parts]
    path = loader.module_path(root, exercise)
    if not path.is_file():
        result.status = NOT_SUBMITTED
        result.message = f"not submitted: no {exercise.name}/{exercise.module}.py"
        result.parts = [PartResult(p.name, NOT_SUBMITTED, result.message, speed=_unmeasured(p, settings))
                        for p in selected]
        return result
    try:
        planned = time.monotonic()
        items = item_plan.plan(exercise, device=settings.device, secret=settings.secret,
                               random_cases=settings.random_cases, speed_budget_s=settings.speed_budget_s,
                               parts=parts, cases_seed=settings.cases_seed)
        result.profile["plan"] = time.monotonic() - planned
        timed = [p for p in selected if any(i.kind == "speed" and i.part is p for i in items)]
        if timed and settings.device == "cuda":
            workload.count_work_in_background(timed)  # CPU work overlapped with the worker's
        scratch.mkdir(parents=True, exist_ok=True)
        seen_root, seen_package = workers.worker_view(settings, root)
        # the kernels' files as the worker reports them: under its view of the tree
        student_dir = os.path.join(seen_root, exercise.name) if settings.sandbox else os.path.realpath(path.parent)
        on_gpu = gpu_references.for_slot(slot)  # the float64 references on the slot's GPU, if it has one
        refs = CaseReferences(settings.references or references.local(settings.secret), exercise.name,
                              compute=on_gpu.compute if on_gpu is not None else None)
        judge = ExerciseJudge(exercise, device=settings.device, student_dir=student_dir, gpu_name=settings.gpu_name,
                              curves=settings.speed_curves, references=refs)
        arbiter = slot.arbiter if slot is not None else None
        groups = _groups(items, settings)

        walls: dict[str, float] = {}  # each group's wall time: the longest is the exercise's critical path (--profile)

        timer = _timer_ahead(settings, scratch, arbiter) if timed and settings.device == "cuda" else None
        yardstick = _Yardstick(yardstick_plans.start(exercise, settings=settings, slot=slot)
                               if timed else None, exercise.name, settings)
        recorded = _Recorded(groups, timer, exercise.name, judge, yardstick)

        def run_group(group: list) -> Run:
            began = time.monotonic()
            try:
                return supervise.run(exercise, root, group, settings, scratch=scratch, cache_dir=cache_dir,
                                     on_reply=judge.on_reply, arbiter=arbiter, defer_speed=True, references=refs,
                                     on_recorded=recorded.add)
            finally:
                walls[_group_name(group)] = time.monotonic() - began
                recorded.ended(group)

        try:
            if len(groups) == 1:
                run = run_group(groups[0])
            else:  # each group in workers of its own, side by side: the exercise takes as long as the longest
                run = Run.merged(_side_by_side(groups, run_group))
            if on_workers_ended is not None:
                on_workers_ended()
            if run.to_time:  # every process of the student's has ended: one trusted timer times every part
                timing = time.monotonic()
                cpu = _time_speed(exercise, settings, run.to_time, scratch=scratch, arbiter=arbiter, timer=timer,
                                  yardstick=yardstick)
                run.notes += yardstick.notes()
                run.add_time(TIMER_STEP, time.monotonic() - timing)
                run.add_cpu(TIMER_STEP, cpu)
                judging = time.monotonic()
                for item, request, reply in run.to_time:
                    judge.on_reply(item, request, reply)
                run.add_time(CREDIT_STEP, time.monotonic() - judging)
        finally:
            if timer is not None:
                timer.close()
        if timer is not None:
            run.add_cpu(TIMER_STEP, timer.cpu_s)  # its start-up too, even where it timed nothing
        result.counts.update({"references computed": refs.computed, "references reused": refs.reused,
                              "worker groups": len(groups)})
        result.profile["longest worker group"] = max(walls.values(), default=0.0)
        if len(walls) > 1:
            result.profile.update({f"worker group {name}": wall for name, wall in walls.items()})
        result.log = "\n".join(run.logs)
        result.problems = run.problems
        result.notes = run.notes
        result.profile.update(run.profile)
        result.cpu = dict(run.cpu)
        result.profile.update(judge.profile)
        result.profile.update(refs.seconds)
        result.parts = [p for p in judge.part_results(items, run) if p.name in {s.name for s in selected}]
    except Exception as exc:  # a fault of the grader: the exercise is regraded, never charged to the student
        result.status = NEEDS_REGRADE
        result.grader_errors = [grader_error(f"{exercise.name} (grading the exercise)", exc)]
        result.message = GRADER_FAULT
        result.parts = [PartResult(p.name, NEEDS_REGRADE, GRADER_FAULT, speed=SpeedResult(NEEDS_REGRADE))
                        for p in selected]
        result.elapsed_s = time.monotonic() - start
        return result
    _clean_paths(result, {os.path.realpath(root) + os.sep: "", str(root) + os.sep: "", seen_root + os.sep: "",
                          os.path.dirname(seen_package) + os.sep: ""})
    _set_status(result)
    result.elapsed_s = time.monotonic() - start
    result.profile["total"] = result.elapsed_s
    return result


def _groups(items: list, settings: RunSettings) -> list[list]:
    """The items in groups that run in workers of their own at once: one per part where ``parallel_parts`` is set
    (on GPUs: compilation is per process, and a host has cores to spare), else one. With ``speed_apart`` too, each
    part's speed measurement (which compiles the benchmarks' kernels, specialized, in a cache of its own) is a group
    of its own, beside the part's correctness checks."""
    if not settings.parallel_parts:
        return [items]
    groups: dict[tuple[str, bool], list] = {}
    for item in items:
        groups.setdefault((item.part.name, settings.speed_apart and item.role == "speed"), []).append(item)
    return list(groups.values())


def _side_by_side(groups: list[list], run_group: Callable[[list], Run]) -> list[Run]:
    """Each group in workers of its own, at once; their runs, in the groups' order."""
    with concurrent.futures.ThreadPoolExecutor(len(groups), thread_name_prefix="part") as pool:
        return list(pool.map(run_group, groups))


class _Recorded:
    """The exercise's speed measurements as the workers record them (every speed item's reply, on its group's
    judging thread). Once every speed item has its reply (or its group has ended without one), the trusted timer
    gets the recordings to load and validate, while the student's workers may still run; each recording's recheck
    is judged as it comes (:meth:`ExerciseJudge.on_recorded`), the last one while the timer prepares."""

    def __init__(self, groups: list[list], timer: timer_process.Timer | None, exercise: str, judge: ExerciseJudge,
                 yardstick: _Yardstick | None = None):
        self.yardstick = yardstick
        ordered = [item for group in groups for item in group]  # Run.merged's order: the timer's jobs must match
        self.order = {item.id: k for k, item in enumerate(ordered)}
        self.waiting = {item.id for item in ordered if item.kind == "speed" and item.skip_reason is None}
        self.timer, self.exercise, self.judge = timer, exercise, judge
        self.entries: dict[str, tuple] = {}
        self.prepared = False
        self.lock = threading.Lock()

    def add(self, item, request, reply) -> None:
        """``item``'s reply, as it comes: its recording, or why there is none (not implemented, raised)."""
        if isinstance(reply, protocol.SpeedDone):
            with self.lock:
                self.entries[item.id] = (item, request, reply)
        self._done({item.id})
        self.judge.on_recorded(item, request, reply)

    def ended(self, group: list) -> None:
        """``group``'s workers have ended: its speed items that recorded nothing never will."""
        self._done({item.id for item in group})

    def _done(self, ids: set[str]) -> None:
        with self.lock:
            self.waiting -= ids
            if self.waiting or self.prepared or not self.entries or self.timer is None:
                return
            self.prepared = True
            to_time = sorted(self.entries.values(), key=lambda entry: self.order[entry[0].id])
        try:
            timer_process.prepare_parts(self.exercise, _part_timings(to_time, self.yardstick), self.timer)
        except Exception:  # the timer then gets its jobs when every worker has ended, as unprepared
            pass


def _group_name(group: list) -> str:
    """A worker group as ``--profile`` names it: its parts, and "speed" for a part's speed measurement apart."""
    parts = dict.fromkeys(item.part.name for item in group)
    speed_only = all(item.role == "speed" for item in group)
    return " + ".join(parts) + (" speed" if speed_only else "")


def _timer_ahead(settings: RunSettings, scratch: Path, arbiter) -> timer_process.Timer | None:
    """The exercise's trusted timer, started now to be ready when the workers end (None where it could not start:
    the timing starts one then, and says why if it fails again)."""
    try:
        return timer_process.Timer(settings, scratch=scratch, arbiter=arbiter)
    except Exception:
        return None


def _time_speed(exercise, settings: RunSettings, to_time: list, *, scratch: Path, arbiter,
                timer: timer_process.Timer | None = None, yardstick: _Yardstick | None = None) -> float:
    """The speed items' recorded launches, timed by the trusted timer (:mod:`.timer_process`; ``timer``: one
    started ahead) beside the reference's (``yardstick``); a failure of the grader's side leaves the part's
    ``timer_fault`` (its speed waits for a regrade). Returns the CPU seconds of the timers started here (not
    ``timer``'s)."""
    parts = _part_timings(to_time, yardstick)
    try:
        return timer_process.time_parts(settings, exercise.name, parts, scratch=scratch, arbiter=arbiter, timer=timer)
    except Exception as exc:  # a bug of the grader's side: every part's speed waits for a regrade
        for entry in parts:
            entry.measurement.timer_fault = entry.measurement.timer_fault or f"{type(exc).__name__}: {exc}"
        return 0.0


def _part_timings(to_time: list, yardstick: _Yardstick | None) -> list[timer_process.PartTiming]:
    timings = []
    for item, _, reply in to_time:
        plans = yardstick.plans(item.part.name) if yardstick is not None else {}
        boundaries = yardstick.boundaries(item.part.name) if yardstick is not None else []
        timings.append(timer_process.PartTiming(item.part.name, reply.measurement, item.budget_s, plans, boundaries))
    return timings


class _Yardstick:
    """The exercise's reference plans for the timer (recorded once per batch and GPU: :mod:`.yardstick_plans`),
    waited for the first time they are needed."""

    def __init__(self, future, exercise: str, settings: RunSettings):
        self.future, self.exercise, self.settings = future, exercise, settings
        self._found: yardstick_plans.Yardstick | None = None
        self._lock = threading.Lock()

    def found(self) -> yardstick_plans.Yardstick | None:
        with self._lock:
            if self._found is None and self.future is not None:
                self._found = yardstick_plans.result(self.future)
            return self._found

    def plans(self, part: str) -> dict:
        found = self.found()
        return dict(found.plans.get(part, {})) if found is not None else {}

    def boundaries(self, part: str) -> list[float]:
        """The credit's boundaries in the timer's ratio (reference / student): the course's reference curve, else
        the default fractions; none for a curve against the baseline (the rounds then stop on a ±1 % ratio)."""
        curve = speed_curves.curve_for(self.settings.speed_curves, self.exercise, part)
        if curve is None:
            return [speed_curves.PARTIAL_FRACTION, speed_curves.FULL_FRACTION]
        return [curve.partial, curve.full] if curve.of == "reference" else []

    def notes(self) -> list[str]:
        found = self.found()
        if found is None or not found.problems:
            return []
        return ["the reference solution could not be timed beside this submission (the grader's side; speed is "
                "credited against the GPU's calibrated thresholds where it has them): " + "; ".join(found.problems)]


def _unmeasured(part, settings: RunSettings) -> SpeedResult:
    if not part.speed_graded:
        return SpeedResult(credit.NOT_GRADED, "this part is not speed-graded")
    return SpeedResult(credit.NOT_MEASURED, "not measured: not submitted")


def _set_status(result: ExerciseResult) -> None:
    statuses = {p.status for p in result.parts}
    if statuses == {NOT_IMPLEMENTED}:
        result.status, result.message = NOT_IMPLEMENTED, result.parts[0].message
    elif statuses and statuses <= {ERROR, NOT_SUBMITTED}:
        result.status, result.message = ERROR, result.parts[0].message
    elif NEEDS_REGRADE in statuses or result.grader_errors:
        result.status = NEEDS_REGRADE
        result.message = result.message or GRADER_FAULT
    else:
        result.status = GRADED
        if result.problems:
            result.message = result.problems[0]


def merge_regrade(previous: ExerciseResult, regraded: ExerciseResult) -> ExerciseResult:
    """``previous`` with the parts of ``regraded`` in place of its own."""
    by_name = {p.name: p for p in regraded.parts}
    merged = replace(
        previous,
        parts=[by_name.get(p.name, p) for p in previous.parts],
        problems=[*previous.problems, *regraded.problems],
        notes=[*previous.notes, *(n for n in regraded.notes if n not in previous.notes)],
        grader_errors=list(regraded.grader_errors),
        log="\n".join(x for x in (previous.log, "--- regrade ---", regraded.log) if x),
        elapsed_s=previous.elapsed_s + regraded.elapsed_s,
        profile={**previous.profile, **{f"regrade: {k}": v for k, v in regraded.profile.items()}},
        cpu=dict(regraded.cpu),  # this run's only: what the batch's --profile adds up
        device=regraded.device or previous.device,
        message="",
    )
    _set_status(merged)
    return merged


def _clean_paths(result: ExerciseResult, replacements: dict[str, str]) -> None:
    """Show the student's files as ``gelu/gelu.py`` rather than the grader's private copy."""

    def clean(text: str) -> str:
        for old, new in replacements.items():
            text = text.replace(old, new)
        return text

    result.problems = [clean(p) for p in result.problems]
    result.log = clean(result.log)
    for part in result.parts:
        part.message = clean(part.message)
        for c in part.checks:
            c.message = clean(c.message)
        for flag in part.flags:
            flag["message"] = clean(flag["message"])
