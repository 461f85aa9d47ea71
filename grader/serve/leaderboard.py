"""The speed leaderboard, per exercise: each student's best time per benchmark, as the grader measured it (never
self-reported) for a part that passed every correctness check, with the GPU and the date. Names are shown only where
a student opted in; the others appear as an anonymous id. On a server that grades on the CPU there are no times:
speed is graded on a GPU only."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from grader.grading.results.class_report import anonymous_id
from grader.serve.db import Database
from grader.serve.records import Principal


@dataclass(frozen=True)
class Entry:
    rank: int
    name: str
    student_ms: float
    ratio: float
    device: str
    date: str
    mine: bool  # the viewer's own entry


@dataclass
class Board:
    exercise: str
    part: str
    benchmark: str
    entries: list[Entry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "entries": [asdict(e) for e in self.entries]}


def boards(db: Database, *, viewer: Principal, salt: str, exercise: str | None = None) -> list[Board]:
    rows = db.query(
        "SELECT sp.student, sp.exercise, sp.part, sp.benchmark, sp.student_ms, sp.ratio, sp.device, sp.measured, "
        "st.display_name, st.leaderboard FROM speed sp JOIN students st ON st.id = sp.student "
        "JOIN submissions su ON su.id = sp.submission "  # a time superseded by a regrade's is history
        "WHERE st.removed IS NULL AND su.superseded_by IS NULL AND (? IS NULL OR sp.exercise = ?) "
        "ORDER BY sp.exercise, sp.part, sp.benchmark, sp.student_ms",
        (exercise, exercise))
    found: dict[tuple[str, str, str], Board] = {}
    seen: set[tuple[str, str, str, str]] = set()
    for row in rows:  # fastest first: a student's first row of a benchmark is their best
        key = (row["exercise"], row["part"], row["benchmark"])
        if (*key, row["student"]) in seen:
            continue
        seen.add((*key, row["student"]))
        board = found.setdefault(key, Board(*key))
        shown = row["display_name"] if row["leaderboard"] and row["display_name"] else anonymous_id(row["student"],
                                                                                                     salt)
        board.entries.append(Entry(len(board.entries) + 1, shown, row["student_ms"], row["ratio"], row["device"],
                                   time.strftime("%Y-%m-%d", time.gmtime(row["measured"])),
                                   viewer.student == row["student"]))
    return list(found.values())
