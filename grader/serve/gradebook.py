"""The instructor's views: each student's latest and best grade, and the class's gradebook built from the result that
counts of every (student, exercise) — the latest on-time one, or the best (``[serve] counts``) — written as a
``grader grade`` output folder by the grader's own writers (``grades.csv``, the class report, each student's
Gradescope ``results.json`` and reports)."""

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
    counts: str = "latest"  # the course's rule: the "latest" or the "best" on-time submission counts
    counting: dict[str, dict[str, Any]] = field(default_factory=dict)  # exercise -> the result that counts

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Counted:
    """One exercise's result that counts (or may count) in the gradebook."""

    submission: int
    student: str
    exercise: str
    score: float | None  # the exercise's graded points (None: not in the summary), before any late penalty
    max_score: float | None
    days_late: int  # under the "penalty" policy, else 0
    factor: float  # the late penalty's factor (1.0 when none)
    folder: str

    @property
    def counted_score(self) -> float | None:
        return None if self.score is None else self.score * self.factor


def candidates(db: Database, policy: Policy | None = None) -> dict[str, dict[str, list[Counted]]]:
    """student -> exercise -> the graded results that may count, best candidate first: the on-time ones (under the
    "penalty" policy, late ones too, their score scaled), of students on the roster, none superseded by a graded
    regrade; ordered by hand-in time, latest first (``counts = "latest"``) or by the (penalized) score, best first,
    the later one first among equals (``counts = "best"``)."""
    penalized = policy is not None and policy.late == "penalty"
    best = policy is not None and policy.counts == "best"
    rows = db.query("SELECT s.id, s.student, s.exercises, s.late, s.created, g.folder, g.score, g.summary "
                    "FROM submissions s JOIN gradebook g ON g.submission = s.id JOIN students st ON st.id = s.student "
                    "AND st.removed IS NULL WHERE s.superseded_by IS NULL ORDER BY s.created DESC, s.id DESC")
    found: dict[str, dict[str, list[Counted]]] = {}
    own: dict[str, Policy] = {}
    for row in rows:
        late = json.loads(row["late"])
        summary = json.loads(row["summary"]).get("exercises", {})
        names = json.loads(row["exercises"])
        for name in names:
            if name in late and not penalized:
                continue
            days, factor = 0, 1.0
            if penalized and policy is not None:
                if row["student"] not in own:
                    own[row["student"]] = extensions.policy_for(db, policy, row["student"])
                days, factor = own[row["student"]].late_factor(name, at=row["created"])
            entry = summary.get(name, {})
            score = entry.get("score", row["score"] if len(names) == 1 else None)
            found.setdefault(row["student"], {}).setdefault(name, []).append(Counted(
                row["id"], row["student"], name, score, entry.get("max_score"), days, factor, row["folder"] or ""))
    if best:
        for by_exercise in found.values():
            for name, listed in by_exercise.items():  # stable: among equal scores the latest stays first
                by_exercise[name] = sorted(listed, key=lambda c: -(c.counted_score or 0.0))
    return found


def counting(db: Database, policy: Policy | None = None) -> dict[str, dict[str, Counted]]:
    """student -> exercise -> the result that counts, as the database records it (the gradebook export reads each
    one's folder, and takes the next candidate where a folder holds no result)."""
    return {student: {name: listed[0] for name, listed in by_exercise.items()}
            for student, by_exercise in candidates(db, policy).items()}


def standings(db: Database, policy: Policy | None = None) -> list[Standing]:
    found = []
    in_force = overrides.current(db)
    counted = counting(db, policy)
    for student in db.query("SELECT id, display_name FROM students WHERE removed IS NULL ORDER BY id"):
        # a superseded submission is history, and a regrade stands for it only once graded
        subs = db.query("SELECT s.id, s.status, s.late, g.score, g.max_score FROM submissions s LEFT JOIN gradebook g "
                        "ON g.submission = s.id WHERE s.student = ? AND s.superseded_by IS NULL AND "
                        "(s.regrade_of IS NULL OR s.status = 'done') ORDER BY s.created DESC, s.id DESC",
                        (student["id"],))
        handed_in = db.query("SELECT COUNT(*) AS n FROM submissions WHERE student = ? AND regrade_of IS NULL",
                             (student["id"],))[0]["n"]
        latest = subs[0] if subs else None
        graded = [r for r in subs if r["score"] is not None]
        best = max(graded, key=lambda r: (r["score"], r["id"])) if graded else None
        found.append(Standing(
            student["id"], student["display_name"], handed_in, latest["id"] if latest else None,
            latest["status"] if latest else None, latest["score"] if latest else None,
            latest["max_score"] if latest else None, json.loads(latest["late"]) if latest else [],
            best["id"] if best else None, best["score"] if best else None, best["max_score"] if best else None,
            {e: {"score": o.score, "reason": o.reason} for e, o in in_force.get(student["id"], {}).items()},
            policy.counts if policy is not None else "latest",
            {e: {"submission": c.submission, "score": c.counted_score, "max_score": c.max_score,
                 "days_late": c.days_late} for e, c in sorted(counted.get(student["id"], {}).items())}))
    return found


def _latest_on_time(db: Database, folder: Path, policy: Policy | None = None
                    ) -> tuple[dict[str, dict[str, tuple[int, ExerciseResult, Path]]], dict[str, dict[str, int]]]:
    """student -> exercise -> (submission id, result, its output folder), from the submission that counts
    (:func:`candidates`: the latest on-time one, or the best, per the policy's ``counts``; under the "penalty" late
    policy, late ones too); and student -> exercise -> the days late of the one chosen, where it was late."""
    chosen: dict[str, dict[str, tuple[int, ExerciseResult, Path]]] = {}
    late_days: dict[str, dict[str, int]] = {}
    loaded: dict[int, dict[str, ExerciseResult] | None] = {}
    for student, by_exercise in candidates(db, policy).items():
        for name, listed in by_exercise.items():
            for candidate in listed:
                if not candidate.folder:
                    continue
                out = storage.submission_dir(folder, candidate.submission) / candidate.folder
                if candidate.submission not in loaded:
                    try:
                        loaded[candidate.submission] = store.load_exercises(out, outcome.student_in(out))
                    except (OSError, ValueError, outcome.NoResult):
                        loaded[candidate.submission] = None
                results = loaded[candidate.submission]
                if results is None or name not in results:
                    continue
                chosen.setdefault(student, {})[name] = (candidate.submission, results[name], out)
                if candidate.days_late:
                    late_days.setdefault(student, {})[name] = candidate.days_late
                break
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
