"""Commit each task's result the moment it is judged.

When a task starts, its "running" marker is written (:mod:`grader.grading.batch.markers`). When its result comes,
the result is saved atomically (``state/<exercise>.json``: from then on the task is done), then the
student's reports and — for a local batch — the gradebook are rewritten, and the marker is removed.

A fault while recording (scoring, a report that cannot be written, ...) is the grader's: the exercise is
saved as "needs regrade" with the traceback for staff, and the batch goes on. If even the result cannot
be saved, the task stays uncommitted (its marker turns stale) and the next run grades it again.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading.batch import markers
from grader.grading.batch.progress import Progress
from grader.grading.batch.scheduler import GpuFailure, Task
from grader.grading.config import Course
from grader.grading.exercise_run.judging import GRADER_FAULT, grader_error
from grader.grading.exercise_run.slots import Slot
from grader.grading.results import rebuild, reports, scoring, store
from grader.grading.results.results import NEEDS_REGRADE, ExerciseResult
from grader.speed import gpu_state


class Recorder:
    def __init__(self, out: Path, *, course: Course, all_exercises: tuple[Exercise, ...], names: list[str],
                 device: str, students: Iterable[str], batch: str, gradebook: bool, progress: Progress,
                 profile: bool = False, sandbox: str = ""):
        self.out, self.course, self.all_exercises, self.names = out, course, all_exercises, list(names)
        self.batch, self.gradebook, self.progress, self.profile = batch, gradebook, progress, profile
        self._reports = {s: rebuild.student_report(out, s, course=course, all_exercises=all_exercises, names=names,
                                                   device=device, sandbox=sandbox) for s in students}
        self._heartbeat = markers.Heartbeat(batch)
        self.cpu_by_step: dict[str, float] = {}  # the committed runs' workers and timers, summed (--profile)

    def started(self, task: Task, slot: Slot) -> None:
        self.progress.start(task.key)
        store.write_marker(self.out, task.student, task.exercise.name, markers.mine(slot=slot.name, batch=self.batch))
        self._heartbeat.add(store.marker_path(self.out, task.student, task.exercise.name))

    def _unmark(self, task: Task) -> None:
        self._heartbeat.discard(store.marker_path(self.out, task.student, task.exercise.name))
        store.remove_marker(self.out, task.student, task.exercise.name)

    def commit(self, task: Task, result: ExerciseResult) -> None:
        store.save_exercise(self.out, task.student, result)  # raises: not committed, graded again next time
        try:
            store.log_grader_errors(self.out, task.student, result)
            self._update(task.student, task.exercise, result, write_student=True)
        except Exception as exc:
            self._fault(task, result, exc)
        finally:
            self._unmark(task)
        where = result.device.get("name") if result.device.get("kind") == "cuda" else None
        self.progress.advance(f"{task.student} {task.exercise.name}: {result.status} ({result.elapsed_s:.1f} s"
                              f"{', ' + str(where) if where else ''})", key=task.key, took_s=result.elapsed_s)
        if self.profile:
            steps = ", ".join([f"{k} {v:.1f} s" for k, v in result.profile.items() if k != "total"]
                              + [f"{k} {v}" for k, v in result.counts.items()])
            self.progress.note(f"  profile {task.student} {task.exercise.name}: {steps}")
            if result.cpu:
                self.progress.note(f"    CPU of its processes: {cpu_text(result.cpu)}")
            for part in result.parts:
                if part.speed.gpu_state:
                    self.progress.note(f"    the GPU around {part.name}'s timed rounds: "
                                       + gpu_state.describe_span(part.speed.gpu_state))
            for step, seconds in result.cpu.items():
                self.cpu_by_step[step] = self.cpu_by_step.get(step, 0.0) + seconds

    def _update(self, student: str, exercise: Exercise, result: ExerciseResult, *, write_student: bool) -> None:
        score = scoring.score_exercise(exercise, result, self.course, self.all_exercises)
        report = self._reports[student]
        pairs = [(s, r) for s, r in report.exercises if s.exercise != exercise.name] + [(score, result)]
        order = {n: i for i, n in enumerate(self.names)}
        report.exercises = sorted(pairs, key=lambda pair: order.get(pair[0].exercise, len(order)))
        report.elapsed_s = sum(r.elapsed_s for _, r in report.exercises)
        if write_student:
            reports.write_student(self.out, report)
        if self.gradebook:
            store.write_atomic(self.out / store.GRADEBOOK,
                               reports.gradebook_csv(list(self._reports.values()), self.names))

    def _fault(self, task: Task, result: ExerciseResult, exc: Exception) -> None:
        """Recording failed: the exercise needs a regrade (never a score built on a half-written record)."""
        result.status, result.message = NEEDS_REGRADE, GRADER_FAULT
        result.grader_errors.append(grader_error(f"{task.exercise.name} (recording the result)", exc))
        for part in result.parts:
            part.status, part.message = NEEDS_REGRADE, GRADER_FAULT
        print(f"grader: recording {task.key} failed ({type(exc).__name__}: {exc}); it needs a regrade",
              file=sys.stderr)
        with contextlib.suppress(Exception):
            store.save_exercise(self.out, task.student, result)
            store.log_grader_errors(self.out, task.student, result)
        with contextlib.suppress(Exception):
            self._update(task.student, task.exercise, result, write_student=False)

    def gpu_failure(self, failure: GpuFailure) -> None:
        self.progress.note(f"GPU {failure.slot} ({failure.device.get('name', '?')}) taken out of the pool: "
                           f"{failure.reason}; its work runs on the other GPUs")
        with contextlib.suppress(OSError):
            store.record_gpu_failure(self.out, failure.to_dict())

    def close(self) -> None:
        self._heartbeat.close()


def cpu_text(cpu: dict[str, float], submissions: int = 0) -> str:
    """CPU seconds per step, largest first, after the total; with ``submissions``, each also per submission."""
    per = (lambda s: f" ({s / submissions:.1f} s per submission)") if submissions else (lambda s: "")
    steps = ", ".join(f"{k} {v:.1f} s{per(v)}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
    return f"{sum(cpu.values()):.1f} s{per(sum(cpu.values()))}: {steps}"
