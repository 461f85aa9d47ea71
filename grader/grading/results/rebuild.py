"""Reports from what an output folder holds: every student's committed results, scored with the batch's
course configuration. The gradebook and the class report are always rebuilt from here, so they are the
same whether the batch ran in one go, was resumed, or ran as Slurm tasks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading.config import Course
from grader.grading.results import class_report, reports, scoring, store


def student_report(out: Path, student: str, *, course: Course, all_exercises: tuple[Exercise, ...],
                   names: Iterable[str], device: str, sandbox: str = "") -> reports.StudentReport:
    """One student's report from the store: their submission's record and their committed results."""
    meta = store.load_submission(out, student)
    report = reports.StudentReport(student, meta["source"], meta["kind"], list(meta.get("problems", [])), device,
                                   sandbox=sandbox)
    by_name = {e.name: e for e in all_exercises}
    results = store.load_exercises(out, student)
    for name in names:
        if name in results and name in by_name:
            report.exercises.append((scoring.score_exercise(by_name[name], results[name], course, all_exercises),
                                     results[name]))
    report.elapsed_s = sum(r.elapsed_s for _, r in report.exercises)
    return report


def all_reports(out: Path, *, course: Course, all_exercises: tuple[Exercise, ...]) -> list[reports.StudentReport]:
    run = store.read_run(out)
    return [student_report(out, s, course=course, all_exercises=all_exercises, names=run["exercises"],
                           device=run.get("device", ""), sandbox=run.get("sandbox", "")) for s in store.students(out)]


def rebuild(out: Path, *, course: Course, all_exercises: tuple[Exercise, ...]) -> list[reports.StudentReport]:
    """Write ``grades.csv`` and the class report from the store; returns the students' reports."""
    run = store.read_run(out)
    students = all_reports(out, course=course, all_exercises=all_exercises)
    store.write_atomic(out / store.GRADEBOOK, reports.gradebook_csv(students, list(run["exercises"])))
    display = {}
    for report in students:
        with contextlib.suppress(OSError, ValueError):
            display[report.student] = store.load_submission(out, report.student).get("display_name")
    page, table = class_report.render(students, run=run, display_names=display,
                                      gpu_failures=store.gpu_failures(out), all_exercises=all_exercises)
    store.write_atomic(out / store.CLASS_REPORT_HTML, page)
    store.write_atomic(out / store.CLASS_REPORT_CSV, table)
    return students
