"""What the course decides about submitting during the term: the ``[serve]`` table of the course file (its defaults
in ``grader/grading/course.toml``) — submissions per student and hour, how many may wait in the queue, deadlines
per exercise and what happens after one."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.grading import config

LATE_POLICIES = ("mark", "refuse", "penalty")
COUNTS = ("latest", "best")  # which of a student's submissions of an exercise counts in the gradebook
DAY_S = 24 * 3600.0
_KEYS = {"submissions_per_hour", "queued_per_student", "queued_total", "late", "penalty_per_day", "deadlines",
         "counts"}


class PolicyError(ValueError):
    """The [serve] table is not usable (told verbatim)."""


@dataclass(frozen=True)
class Policy:
    submissions_per_hour: int = 6
    queued_per_student: int = 3  # waiting at once, per student: keeps the queue bounded
    queued_total: int = 200  # waiting at once, the whole class: past it, uploads are refused before they are read
    late: str = "mark"  # "mark": graded and marked late; "refuse": the late exercises are not graded;
    # "penalty": graded, and in the gradebook at (1 - penalty_per_day x each day or part of one late), at least 0
    penalty_per_day: float = 0.0  # a fraction of the exercise's points
    deadlines: Mapping[str, float] = field(default_factory=dict)  # exercise -> POSIX time
    counts: str = "latest"  # per exercise, the gradebook takes the "latest" on-time submission or the "best" one

    def counting_rule(self) -> str:
        """Which submission counts, in a sentence to the student."""
        if self.late == "penalty":
            return (f"Your {self.counts} submission counts (per exercise); a late one counts "
                    f"{round(self.penalty_per_day * 100)}% less per started day late.")
        return f"Your {self.counts} on-time submission counts (per exercise)."

    def late_exercises(self, exercises: list[str], *, at: float) -> list[str]:
        """The exercises of ``exercises`` whose deadline has passed at time ``at``."""
        return [e for e in exercises if e in self.deadlines and at > self.deadlines[e]]

    def late_factor(self, exercise: str, *, at: float) -> tuple[int, float]:
        """(days late, each started day counted; the factor the score is multiplied by) of a hand-in at ``at``
        under the "penalty" policy; (0, 1.0) when on time or under another policy."""
        due = self.deadlines.get(exercise)
        if self.late != "penalty" or due is None or at <= due:
            return 0, 1.0
        days = math.ceil((at - due) / DAY_S)
        return days, max(0.0, 1.0 - self.penalty_per_day * days)

    def with_extensions(self, extended: Mapping[str, float]) -> Policy:
        """This policy for one student: their extensions (exercise -> deadline) replace the course's deadlines;
        an extension never shortens one."""
        deadlines = {e: max(t, extended.get(e, t)) for e, t in self.deadlines.items()}
        return dataclasses.replace(self, deadlines=deadlines)

    def to_dict(self) -> dict[str, Any]:
        return {"submissions_per_hour": self.submissions_per_hour, "queued_per_student": self.queued_per_student,
                "queued_total": self.queued_total, "late": self.late, "penalty_per_day": self.penalty_per_day,
                "deadlines": {e: _iso(t) for e, t in sorted(self.deadlines.items())}, "counts": self.counts}


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _deadline(exercise: str, value: Any, source: str) -> float:
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise PolicyError(f"{source}: [serve.deadlines] {exercise} = {value!r} is not a date and time") from None
    if isinstance(value, dt.datetime):
        return value.timestamp()  # without an offset: the server's local time
    if isinstance(value, dt.date):  # a date alone: the end of that day, local time
        return dt.datetime.combine(value, dt.time(23, 59, 59)).timestamp()
    raise PolicyError(f"{source}: [serve.deadlines] {exercise} must be a date and time, e.g. 2025-10-10T23:59:00Z")


def from_table(table: Mapping[str, Any], *, source: str, known: tuple[str, ...] = ()) -> Policy:
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise PolicyError(f"{source}: [serve] has unknown key(s) {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(_KEYS))})")
    deadlines = table.get("deadlines", {})
    if not isinstance(deadlines, Mapping):
        raise PolicyError(f"{source}: [serve.deadlines] must be a table")
    strange = sorted(set(deadlines) - set(known)) if known else []
    if strange:
        raise PolicyError(f"{source}: [serve.deadlines] names unknown exercise(s) {', '.join(strange)}")
    policy = Policy(
        submissions_per_hour=int(table.get("submissions_per_hour", Policy.submissions_per_hour)),
        queued_per_student=int(table.get("queued_per_student", Policy.queued_per_student)),
        queued_total=int(table.get("queued_total", Policy.queued_total)),
        late=str(table.get("late", Policy.late)),
        penalty_per_day=float(table.get("penalty_per_day", Policy.penalty_per_day)),
        deadlines={str(e): _deadline(str(e), v, source) for e, v in deadlines.items()},
        counts=str(table.get("counts", Policy.counts)),
    )
    if policy.counts not in COUNTS:
        raise PolicyError(f"{source}: [serve] counts must be one of {', '.join(COUNTS)}, not {policy.counts!r}")
    if policy.late not in LATE_POLICIES:
        raise PolicyError(f"{source}: [serve] late must be one of {', '.join(LATE_POLICIES)}, not {policy.late!r}")
    if policy.late == "penalty" and not 0 < policy.penalty_per_day <= 1:
        raise PolicyError(f"{source}: [serve] late = \"penalty\" needs penalty_per_day, a fraction of the points "
                          f"above 0 and at most 1 (0.1: 10% a day), not {policy.penalty_per_day}")
    if min(policy.submissions_per_hour, policy.queued_per_student, policy.queued_total) < 1:
        raise PolicyError(f"{source}: [serve] submissions_per_hour, queued_per_student and queued_total must be at "
                          "least 1")
    return policy


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{path}: cannot read it: {exc}") from None


def load(course: Path | None, *, known: tuple[str, ...] = ()) -> Policy:
    """The bundled [serve] table with the course file's laid over it, key by key."""
    table = dict(_read(config.COURSE_FILE).get("serve", {}))
    source = str(config.COURSE_FILE)
    if course is not None:
        overlay = _read(course).get("serve", {})
        if not isinstance(overlay, Mapping):
            raise PolicyError(f"{course}: [serve] must be a table")
        table.update(overlay)
        source = str(course)
    return from_table(table, source=source, known=known)
