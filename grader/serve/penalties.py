"""The "penalty" late policy in the gradebook: an exercise handed in late counts at (1 - penalty_per_day x days
late), each started day counted, never below 0; ``grades.csv`` says so in a column of its own."""

from __future__ import annotations

from pathlib import Path

from grader.serve import overrides
from grader.serve.policy import Policy

COLUMN = "late_penalties"


def apply_to_csv(path: Path, late_days: dict[str, dict[str, int]], policy: Policy) -> None:
    """Scale each late exercise's points in the gradebook ``path``; ``late_days``: student -> exercise -> days."""
    header, by_student = overrides.read_gradebook(path)
    fields = header + ([COLUMN] if COLUMN not in header else [])
    for student, exercises in late_days.items():
        row = by_student.get(student)
        if row is None:
            continue
        notes = []
        for name, days in sorted(exercises.items()):
            factor = max(0.0, 1.0 - policy.penalty_per_day * days)
            overrides.set_points(row, name, float(row.get(name) or 0) * factor)
            notes.append(f"{name}: {days} day(s) late, -{round((1 - factor) * 100)}%")
        row[COLUMN] = "; ".join(notes)
    overrides.write_gradebook(path, fields, by_student)
