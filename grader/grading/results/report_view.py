"""What a student's report says, decided once: :func:`view` turns a report into blocks in reading order (the header,
the notes, the summary, then per exercise its lines, each part's failures, hints, checks, flags and speed, and what
went wrong while grading). ``report.md`` and ``report.html`` (:mod:`grader.grading.results.reports`) are two thin
renderers of the same blocks: neither decides what is shown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grader.grading.results.results import ExerciseResult, PartResult
from grader.grading.results.scoring import LINE_REGRADE, ExerciseScore
from grader.grading.results.scoring import points_text as pts
from grader.speed import credit
from grader.speed.credit import BenchmarkCredit

if TYPE_CHECKING:
    from grader.grading.results.reports import StudentReport

REGRADE_NOTE = ("Some parts need a regrade: the grader failed while judging them (a fault of the grader, not of "
                "your code). They are not scored yet; the total will change when they are regraded.")


def total_text(score: float, max_score: float, pending: float) -> str:
    text = f"{pts(score)} / {pts(max_score)}"
    return text + (f" ({pts(pending)} pending a regrade)" if pending > 0 else "")


def unavailable_note(report: StudentReport) -> str:
    """Why the maximum is below the course's: the points this device cannot award, and the reason ("" if none)."""
    missing = report.unavailable
    if missing <= 0:
        return ""
    reasons = sorted({u.reason for s, _ in report.exercises for u in s.unavailable})
    return (f"The maximum here is {pts(report.max_score)} points, not {pts(report.max_score + missing)}: the "
            f"other {pts(missing)} are speed points, not available in this run — " + "; ".join(reasons) + ".")


def status_text(score: ExerciseScore) -> str:
    if score.pending > 0:
        return "needs regrade"
    if score.status == "graded":
        return "graded" if score.score >= score.max_score - 1e-9 else "graded (see below)"
    return score.status


def ran_on(result: ExerciseResult) -> str:
    """' on GPU 2 (NVIDIA H100, GPU-...)' and the GPUs that failed under it, if any; nothing on the CPU."""
    device = result.device
    if device.get("kind") != "cuda":
        return ""
    text = f" on GPU {device.get('index', '?')} ({device.get('name', '?')}, {device.get('uuid') or 'no UUID'})"
    if device.get("replaces"):
        text += f", graded again there after a GPU failed: {'; '.join(device['replaces'])}"
    return text


# ------------------------------------------------------------------------------------------ the blocks


@dataclass(frozen=True)
class Line:
    """A row of an exercise's table: a scored line, or points this device cannot award (``unavailable``)."""

    name: str
    points: str  # "3.5 / 4.63", "– / 4.63", "– / 4.63 (not counted)"
    result: str  # the line's status, or "not available: <reason>"
    css: str  # "passed" | "failed" | "regrade" | "" (an unavailable row)


@dataclass(frozen=True)
class Checks:
    """Every check of a part that failed somewhere, grouped by kind: (kind, [(passed, label, reason)])."""

    exercise: str
    part: str
    passed: int
    total: int
    kinds: list[tuple[str, list[tuple[bool, str, str]]]]


@dataclass(frozen=True)
class PartView:
    """What a part adds below its exercise's table, each piece absent where it has nothing to say."""

    name: str
    failure: tuple[str, str] | None = None  # (label, message) of the smallest failing check
    hints: list[tuple[str, str]] = field(default_factory=list)  # (where it comes from, the hint)
    checks: Checks | None = None
    flags: list[tuple[str, str]] = field(default_factory=list)  # (rule, message)
    speed: str | None = None  # the speed message; None where the part's speed is not graded and says nothing
    speed_rows: list[BenchmarkCredit] = field(default_factory=list)  # a table (and a plot) when there are rows
    roofline: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExerciseView:
    exercise: str
    title: str
    total: str
    status_message: tuple[str, str] | None  # (status, message) of an exercise that was not graded
    lines: list[Line]
    parts: list[PartView]
    problems: list[str]
    notes: list[str]
    took: str  # "12.3 s on GPU 0 (...)"


@dataclass(frozen=True)
class ReportView:
    student: str
    total: str
    graded_with: str
    started: str
    elapsed_s: float
    source: str
    kind: str
    unavailable: str  # the note on points this device cannot award ("" if none)
    regrade: str  # the parts waiting for a regrade, comma-separated ("" if none)
    problems: list[str]
    summary: list[tuple[str, str, str]]  # (exercise, total, status)
    exercises: list[ExerciseView]


def view(report: StudentReport) -> ReportView:
    return ReportView(
        student=report.student, total=total_text(report.score, report.max_score, report.pending),
        graded_with=report.graded_with, started=report.started, elapsed_s=report.elapsed_s, source=report.source,
        kind=report.kind, unavailable=unavailable_note(report),
        regrade=", ".join(report.regrade_parts()) if report.pending > 0 else "", problems=list(report.problems),
        summary=[(s.exercise, total_text(s.score, s.max_score, s.pending), status_text(s))
                 for s, _ in report.exercises],
        exercises=[_exercise(score, result) for score, result in report.exercises])


def _exercise(score: ExerciseScore, result: ExerciseResult) -> ExerciseView:
    lines = [Line(line.name, f"{'–' if line.status == LINE_REGRADE else pts(line.score)} / {pts(line.max_score)}",
                  line.status, {"passed": "passed", "failed": "failed"}.get(line.status, "regrade"))
             for line in score.lines]
    lines += [Line(f"{score.exercise} / {u.part}: speed", f"– / {pts(u.points)} (not counted)",
                   f"not available: {u.reason}", "") for u in score.unavailable]
    return ExerciseView(
        exercise=score.exercise, title=score.title, total=total_text(score.score, score.max_score, score.pending),
        status_message=(score.status, score.message) if score.status != "graded" and score.message else None,
        lines=lines, parts=[_part(score.exercise, part) for part in result.parts], problems=list(result.problems),
        notes=list(result.notes), took=f"{result.elapsed_s:.1f} s{ran_on(result)}")


def _part(exercise: str, part: PartResult) -> PartView:
    failure = part.first_failure() if part.status == "graded" else None
    hints, checks = [], None
    if failure is not None:
        if hint := part.layout_hint():
            hints.append(("all its cases", hint))
        if common := part.common_hint():
            hint, n, of = common
            hints.append((f"{n} of {of} failing checks", hint))
        checks = Checks(exercise, part.name, part.passed_cases, len(part.correctness),
                        [(kind, [(c.passed, c.label, c.reason) for c in found])
                         for kind, found in part.checks_by_kind()])
    speed = part.speed
    shown = bool(speed.rows) or speed.status != credit.NOT_GRADED
    return PartView(part.name, (failure.label, failure.message) if failure is not None else None, hints, checks,
                    [(f["rule"], f["message"]) for f in part.flags], speed.message if shown else None,
                    list(speed.rows), dict(speed.roofline))
