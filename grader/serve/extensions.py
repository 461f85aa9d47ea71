"""Per-student extensions: an exercise's deadline moved for one student (an illness, an accommodation), with a reason.
A submission is late for a student after their own deadline; the latest extension per (student, exercise) holds."""

from __future__ import annotations

import datetime as dt
import time

from grader.serve import audit
from grader.serve.db import Database
from grader.serve.policy import Policy


class ExtensionError(ValueError):
    """An extension that cannot be granted (told verbatim)."""


def parse_until(text: str) -> float:
    """A date and time (ISO 8601; without an offset, the server's local time), or a date alone: the end of that day."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ExtensionError(f"{text!r} is not a date and time (e.g. 2025-10-17T23:59 or 2025-10-17)") from None
    if len(text.strip()) == 10:  # a date alone
        value = dt.datetime.combine(value.date(), dt.time(23, 59, 59))
    return value.timestamp()


def grant(db: Database, student: str, exercise: str, until: float, reason: str, *, policy: Policy,
          actor: str = audit.CLI) -> None:
    """Move ``exercise``'s deadline for ``student`` to ``until``."""
    reason = reason.strip()
    if not reason:
        raise ExtensionError("an extension needs a reason (--reason): it is kept in the audit log")
    if exercise not in policy.deadlines:
        known = ", ".join(sorted(policy.deadlines)) or "none"
        raise ExtensionError(f"{exercise} has no deadline in the course file to extend (exercises with one: {known})")
    with db.transaction() as conn:
        if not conn.execute("SELECT 1 FROM students WHERE id = ? AND removed IS NULL", (student,)).fetchone():
            raise ExtensionError(f"{student} is not on the roster")
        conn.execute("INSERT INTO extensions (student, exercise, until, reason, at, actor) VALUES (?, ?, ?, ?, ?, ?)",
                     (student, exercise, until, reason, time.time(), actor))
        when = dt.datetime.fromtimestamp(until, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        audit.record(conn, actor, "extension", student, f"{exercise} until {when} ({reason})")


def of_student(db: Database, student: str) -> dict[str, float]:
    """exercise -> ``student``'s own deadline, for the exercises they have an extension of."""
    return {r["exercise"]: r["until"] for r in db.query(
        "SELECT exercise, until FROM extensions WHERE student = ? ORDER BY id", (student,))}


def policy_for(db: Database, policy: Policy, student: str) -> Policy:
    """The course's policy with ``student``'s extensions applied."""
    return policy.with_extensions(of_student(db, student))
