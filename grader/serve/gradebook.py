"""The instructor's views: each student's latest and best grade, and the class's gradebook built from the latest
on-time result of every (student, exercise) — written as a ``grader grade`` output folder by the grader's own
writers (``grades.csv``, the class report, each student's Gradescope ``results.json`` and reports)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grader.checks.spec import Exercise
from grader.grading.config import Course
from grader.grading.results import rebuild, reports, store
from grader.grading.results.results import ExerciseResult
from grader.serve import extensions, outcome, overrides, penalties, storage
from grader.serve.db import Database
from grader.serve.policy import Policy


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
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)  # exercise -> the override and its reason

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def standings(db: Database) -> list[Standing]:
    found = []
    in_force = overrides.current(db)
    for student in db.query("SELECT id, display_name FROM students WHERE removed IS NULL ORDER BY id"):
        subs = db.query("SELECT s.id, s.status, s.late, g.score, g.max_score FROM submissions s LEFT JOIN gradebook g "
                        "ON g.submission = s.id WHERE s.student = ? ORDER BY s.id DESC", (student["id"],))
        latest = subs[0] if subs else None
        graded = [r for r in subs if r["score"] is not None]
        best = max(graded, key=lambda r: (r["score"], r["id"])) if graded else None
        found.append(Standing(
            student["id"], student["display_name"], len(subs), latest["id"] if latest else None,
            latest["status"] if latest else None, latest["score"] if latest else None,
            latest["max_score"] if latest else None, json.loads(latest["late"]) if latest else [],
            best["id"] if best else None, best["score"] if best else None, best["max_score"] if best else None,
            {e: {"score": o.score, "reason": o.reason} for e, o in in_force.get(student["id"], {}).items()}))
    return found


def _latest_on_time(db: Database, folder: Path, policy: Policy | None = None
                    ) -> tuple[dict[str, dict[str, tuple[int, ExerciseResult, Path]]], dict[str, dict[str, int]]]:
    """student -> exercise -> (submission id, result, its output folder), from the latest on-time graded
    submission holding that exercise (under the "penalty" late policy, the latest one, late or not); and
    student -> exercise -> the days late of the one chosen, where it was late."""
    chosen: dict[str, dict[str, tuple[int, ExerciseResult, Path]]] = {}
    late_days: dict[str, dict[str, int]] = {}
    penalized = policy is not None and policy.late == "penalty"
    # a student removed from the roster keeps their history but leaves the gradebook
    rows = db.query("SELECT s.id, s.student, s.exercises, s.late, s.created, g.folder FROM submissions s JOIN "
                    "gradebook g ON g.submission = s.id JOIN students st ON st.id = s.student AND st.removed IS NULL "
                    "WHERE g.folder IS NOT NULL ORDER BY s.id DESC")
    for row in rows:
        out = storage.submission_dir(folder, row["id"]) / row["folder"]
        wanted = [e for e in json.loads(row["exercises"]) if (penalized or e not in json.loads(row["late"]))
                  and e not in chosen.get(row["student"], {})]
        if not wanted:
            continue
        try:
            results = store.load_exercises(out, outcome.student_in(out))
        except (OSError, ValueError, outcome.NoResult):
            continue
        own = extensions.policy_for(db, policy, row["student"]) if penalized and policy else None
        for name in wanted:
            if name in results:
                chosen.setdefault(row["student"], {})[name] = (row["id"], results[name], out)
                days = own.late_factor(name, at=row["created"])[0] if own else 0
                if days:
                    late_days.setdefault(row["student"], {})[name] = days
    return chosen, late_days


def build(db: Database, *, folder: Path, out: Path, course: Course, all_exercises: tuple[Exercise, ...],
          exercises: list[str], policy: Policy | None = None) -> list[reports.StudentReport]:
    """Write the class's gradebook into ``out`` (a ``grader grade`` output folder, rebuilt from scratch)."""
    store.clear_results(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen, late_days = _latest_on_time(db, folder, policy)
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
    if policy is not None and late_days:
        penalties.apply_to_csv(out / store.GRADEBOOK, late_days, policy)
    overrides.apply_to_csv(out / store.GRADEBOOK, overrides.current(db))  # an override has the last word
    return students
