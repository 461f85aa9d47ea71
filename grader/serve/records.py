"""The server's typed records, and their one conversion to plain data (``to_dict``) for the API and the pages."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass, field
from typing import Any

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
STUDENT, INSTRUCTOR = "student", "instructor"


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: a student of the roster, or the instructor."""

    role: str  # STUDENT | INSTRUCTOR
    student: str | None = None  # the roster id (students only)

    @property
    def is_instructor(self) -> bool:
        return self.role == INSTRUCTOR

    def may_see(self, owner: str) -> bool:
        """Whether this principal may see what belongs to student ``owner``."""
        return self.is_instructor or (self.student is not None and self.student == owner)


@dataclass(frozen=True)
class Student:
    id: str
    display_name: str | None
    leaderboard: bool  # opted into showing display_name on the leaderboard
    removed: bool = False  # dropped from the roster: kept for their submissions' history

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Student:
        return cls(row["id"], row["display_name"], bool(row["leaderboard"]), row["removed"] is not None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Grade:
    """A submission's gradebook entry."""

    score: float
    max_score: float
    device: str
    folder: str | None  # the grading output folder, relative to the submission's folder
    exercises: dict[str, dict[str, Any]]  # name -> {"score", "max_score", "status"}
    notes: list[str] = field(default_factory=list)  # e.g. why speed points are not available here
    graded: float = 0.0

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Grade:
        summary = json.loads(row["summary"])
        return cls(row["score"], row["max_score"], row["device"], row["folder"], summary.get("exercises", {}),
                   list(summary.get("notes", [])), row["graded"])

    def summary_json(self) -> str:
        return json.dumps({"exercises": self.exercises, "notes": self.notes}, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Submission:
    id: int
    student: str
    filename: str
    kind: str
    bytes: int
    exercises: list[str]
    late: list[str]  # exercises handed in after their deadline
    created: float
    status: str  # QUEUED | RUNNING | DONE | FAILED
    attempts: int
    started: float | None
    finished: float | None
    message: str
    position: int | None = None  # 1-based place in the queue (queued only)
    progress: str = ""  # while running: exercises graded so far
    grade: Grade | None = None
    student_removed: bool = False  # its student was removed from the roster: history, not in the gradebook
    regrade_of: int | None = None  # a regrade (after a grader fix) of that submission: the same upload graded again
    superseded_by: int | None = None  # its regrade is graded: that one counts, this one is history
    counts_for: list[str] = field(default_factory=list)  # the exercises whose counting result is this one's

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Submission:
        return cls(row["id"], row["student"], row["filename"], row["kind"], row["bytes"], json.loads(row["exercises"]),
                   json.loads(row["late"]), row["created"], row["status"], row["attempts"], row["started"],
                   row["finished"], row["message"], regrade_of=row["regrade_of"], superseded_by=row["superseded_by"])

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["grade"] = self.grade.to_dict() if self.grade else None
        data["superseded"] = self.superseded_by is not None
        return data


@dataclass(frozen=True)
class SpeedTime:
    """One benchmark time the grader measured for a submission (the leaderboard's unit)."""

    exercise: str
    part: str
    benchmark: str
    student_ms: float
    ratio: float
    device: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
