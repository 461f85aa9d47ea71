"""The instructor's views: each student's latest and best grade, and the class's gradebook built from the latest
on-time result of every (student, exercise) — written as a ``grader grade`` output folder by the grader's own
writers (``grades.csv``, the class report, each student's Gradescope ``results.json`` and reports)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grader.checks.spec import Exercise
from grader.grading.config import Course
from grader.grading.results import rebuild, reports, store
from grader.grading.results.results import ExerciseResult
from grader.serve import outcome, storage
from grader.serve.db import Database


@dataclass(frozen=True)
class Standing:
    student: str
    display_name: str | None
    submissions: int
    latest_id: int | None
    latest_status: str | None
    latest_score: float | None
    latest_max: float | None
    latest_late: list[str]
    best_id: int | None
    best_score: float | None
    best_max: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def standings(db: Database) -> list[Standing]:
    found = []
    for student in db.query("SELECT id, display_name FROM students ORDER BY id"):
        subs = db.query("SELECT s.id, s.status, s.late, g.score, g.max_score FROM submissions s LEFT JOIN gradebook g "
                        "ON g.submission = s.id WHERE s.student = ? ORDER BY s.id DESC", (student["id"],))
        latest = subs[0] if subs else None
        graded = [r for r in subs if r["score"] is not None]
        best = max(graded, key=lambda r: (r["score"], r["id"])) if graded else None
        found.append(Standing(
            student["id"], student["display_name"], len(subs), latest["id"] if latest else None,
            latest["status"] if latest else None, latest["score"] if latest else None,
            latest["max_score"] if latest else None, json.loads(latest["late"]) if latest else [],
            best["id"] if best else None, best["score"] if best else None, best["max_score"] if best else None))
    return found


def _latest_on_time(db: Database, folder: Path) -> dict[str, dict[str, tuple[int, ExerciseResult, Path]]]:
    """student -> exercise -> (submission id, result, its output folder), from the latest on-time graded
    submission holding that exercise."""
    chosen: dict[str, dict[str, tuple[int, ExerciseResult, Path]]] = {}
    rows = db.query("SELECT s.id, s.student, s.exercises, s.late, g.folder FROM submissions s JOIN gradebook g "
                    "ON g.submission = s.id WHERE g.folder IS NOT NULL ORDER BY s.id DESC")
    for row in rows:
        out = storage.submission_dir(folder, row["id"]) / row["folder"]
        wanted = [e for e in json.loads(row["exercises"]) if e not in json.loads(row["late"])
                  and e not in chosen.get(row["student"], {})]
        if not wanted:
            continue
        try:
            results = store.load_exercises(out, outcome.student_in(out))
        except (OSError, ValueError, outcome.NoResult):
            continue
        for name in wanted:
            if name in results:
                chosen.setdefault(row["student"], {})[name] = (row["id"], results[name], out)
    return chosen


def build(db: Database, *, folder: Path, out: Path, course: Course, all_exercises: tuple[Exercise, ...],
          exercises: list[str]) -> list[reports.StudentReport]:
    """Write the class's gradebook into ``out`` (a ``grader grade`` output folder, rebuilt from scratch)."""
    store.clear_results(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = _latest_on_time(db, folder)
    run: dict[str, Any] = {}
    names = {s["id"]: (s["display_name"] if s["leaderboard"] else None)
             for s in db.query("SELECT id, display_name, leaderboard FROM students")}
    for student, by_exercise in sorted(chosen.items()):
        ids = sorted({sid for sid, _, _ in by_exercise.values()})
        for _, result, source in by_exercise.values():
            store.save_exercise(out, student, result)
            run = run or store.read_run(source)
        store.save_submission(out, student, {
            "source": "grader serve submission(s) " + ", ".join(f"#{i}" for i in ids), "kind": "upload",
            "problems": [], "display_name": names.get(student)})
    store.write_run(out, {**{k: v for k, v in run.items() if k != "submissions"}, "exercises": exercises,
                          "device": run.get("device", "no submission graded yet"),
                          "started": run.get("started", "-")})
    students = rebuild.rebuild(out, course=course, all_exercises=all_exercises)
    for report in students:
        reports.write_student(out, report)
    return students
