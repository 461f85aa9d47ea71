"""The instructor's overrides: an exercise's score for one student set by hand, always with a reason. The gradebook
(the standings, ``grades.csv`` of the export and of the instructor's page) shows the overridden score, the override
and its reason; the graded results and reports stay as the grader wrote them."""

from __future__ import annotations

import csv
import io
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grader.grading.results.scoring import points_text as _points
from grader.serve import audit
from grader.serve.db import Database

COLUMNS = ("overrides", "override_reasons")  # added to grades.csv


class OverrideError(ValueError):
    """An override that cannot be made (told verbatim)."""


@dataclass(frozen=True)
class Override:
    student: str
    exercise: str
    score: float
    reason: str
    at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def set_override(db: Database, student: str, exercise: str, score: float | None, reason: str, *,
                 known: tuple[str, ...], actor: str = audit.CLI) -> None:
    """Override ``student``'s score on ``exercise`` (``score`` None: clear the override), with a reason."""
    reason = reason.strip()
    if not reason:
        raise OverrideError("an override needs a reason (--reason): it is shown in the gradebook")
    if known and exercise not in known:
        raise OverrideError(f"unknown exercise {exercise!r} (known: {', '.join(known)})")
    if score is not None and score < 0:
        raise OverrideError(f"a score is at least 0, not {score}")
    with db.transaction() as conn:
        if not conn.execute("SELECT 1 FROM students WHERE id = ? AND removed IS NULL", (student,)).fetchone():
            raise OverrideError(f"{student} is not on the roster")
        conn.execute("INSERT INTO overrides (student, exercise, score, reason, at, actor) VALUES (?, ?, ?, ?, ?, ?)",
                     (student, exercise, score, reason, time.time(), actor))
        what = "cleared" if score is None else f"{score:g}"
        audit.record(conn, actor, "override", student, f"{exercise}: {what} ({reason})")


def current(db: Database) -> dict[str, dict[str, Override]]:
    """student -> exercise -> the override in force (the latest, unless it cleared it)."""
    found: dict[str, dict[str, Override]] = {}
    for row in db.query("SELECT * FROM overrides ORDER BY id"):
        if row["score"] is None:
            found.get(row["student"], {}).pop(row["exercise"], None)
        else:
            found.setdefault(row["student"], {})[row["exercise"]] = Override(
                row["student"], row["exercise"], row["score"], row["reason"], row["at"])
    return {student: exercises for student, exercises in found.items() if exercises}


def read_gradebook(path: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    """grades.csv as (its columns, student -> row)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), {r["student"]: r for r in rows}


def write_gradebook(path: Path, fields: list[str], by_student: dict[str, dict[str, str]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", restval="")
    writer.writeheader()
    writer.writerows(sorted(by_student.values(), key=lambda r: r["student"]))
    path.write_text(buf.getvalue())


def set_points(row: dict[str, str], exercise: str, points: float) -> None:
    """``exercise``'s points in a gradebook row, its total adjusted by the difference."""
    old = float(row.get(exercise) or 0)
    row[exercise] = _points(points)
    row["total"] = _points(float(row.get("total") or 0) - old + points)


def apply_to_csv(path: Path, in_force: dict[str, dict[str, Override]]) -> None:
    """Rewrite the gradebook ``path`` with the overrides: the exercise's score replaced, the total adjusted, and the
    override and its reason in columns of their own; a student with no graded result gets a row of their own."""
    header, by_student = read_gradebook(path)
    fields = header + [c for c in COLUMNS if c not in header]
    for student, exercises in sorted(in_force.items()):
        row = by_student.setdefault(student, {"student": student, "total": "0"})
        for name, override in sorted(exercises.items()):
            set_points(row, name, override.score)
        row["overrides"] = "; ".join(f"{n}: {_points(o.score)}" for n, o in sorted(exercises.items()))
        row["override_reasons"] = "; ".join(f"{n}: {o.reason}" for n, o in sorted(exercises.items()))
    write_gradebook(path, fields, by_student)
