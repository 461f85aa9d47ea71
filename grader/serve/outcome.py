"""What a grading output folder says about one submission, as the server records it: the score, each exercise's
score and status, and the speed times the grader measured (the leaderboard's, from each part's speed rows)."""

from __future__ import annotations

from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading.config import Course
from grader.grading.results import rebuild, reports, store
from grader.grading.results.results import ExerciseResult
from grader.serve.records import Grade, SpeedTime
from grader.speed import credit


class NoResult(RuntimeError):
    """The output folder holds no graded submission (the message says what it holds instead)."""


def student_in(out: Path) -> str:
    found = store.students(out)
    if len(found) != 1:
        raise NoResult(f"{out}: expected one graded submission, found {len(found)}")
    return found[0]


def read(out: Path, *, folder: str, course: Course, all_exercises: tuple[Exercise, ...]) -> tuple[Grade,
                                                                                                   list[SpeedTime]]:
    """The grade and the measured times of the one submission graded into ``out`` (``folder``: ``out`` relative to
    the submission's folder, where the reports are read from later)."""
    student = student_in(out)
    run = store.read_run(out)
    report = rebuild.student_report(out, student, course=course, all_exercises=all_exercises, names=run["exercises"],
                                    device=run.get("device", ""), sandbox=run.get("sandbox", ""))
    exercises = {score.exercise: {"score": score.score, "max_score": score.max_score,
                                  "status": reports.status_text(score)} for score, _ in report.exercises}
    notes = [n for n in (reports.unavailable_note(report),) if n]
    if report.ungradable:
        notes.append(f"nothing could be graded: {report.ungradable}")
    grade = Grade(score=report.score, max_score=report.max_score, device=report.graded_with, folder=folder,
                  exercises=exercises, notes=notes)
    return grade, [t for _, result in report.exercises for t in speed_times(result)]


def speed_times(result: ExerciseResult) -> list[SpeedTime]:
    """The benchmark times the grader measured and trusts, of kernels that are right: measured parts without
    integrity flags or a pending regrade and with no failed correctness check (a kernel wrong on some inputs does
    not rank, however fast), rows with a time and a ratio (on a CPU there are none: speed is not measured there)."""
    found = []
    for part in result.parts:
        if part.speed.status != credit.MEASURED or part.flags or part.needs_regrade:
            continue
        if not all(check.passed for check in part.correctness):
            continue
        for row in part.speed.rows:
            if row.student_ms and row.student_ms > 0 and row.ratio and row.ratio > 0:
                found.append(SpeedTime(result.exercise, part.name, row.label, float(row.student_ms), float(row.ratio),
                                       str(result.device.get("name") or result.device.get("kind") or "?")))
    return found


def report_dir(out: Path) -> Path:
    """The student's report folder inside an output folder (report.md, report.html, results.json)."""
    return store.student_dir(out, student_in(out))


def progress(out: Path, total: int) -> str:
    """While grading: how many of the ``total`` exercises have a result."""
    students = store.students(out) if out.is_dir() else []
    done = len(store.committed(out, students[0])) if len(students) == 1 else 0
    return f"{done} of {total} exercise(s) graded"
