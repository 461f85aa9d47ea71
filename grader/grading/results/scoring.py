"""Points: every number in a report comes from here (and the course file, :mod:`grader.grading.config`).

Per part, in course points:

* correctness: ``Part.points`` shared among the part's checks (examples, random cases, bad inputs) —
  ``correctness = "fraction"`` — or earned only if all pass (``"all-or-nothing"``);
* each extra check (e.g. FlashAttention's memory bound): its ``points`` if it passes;
* speed: ``Part.speed_points`` × the credit of :mod:`grader.speed.credit`. On a GPU every speed-graded part
  has its speed line (0 where the student's code could not be measured: not submitted, not implemented, an
  error). Where the device cannot measure speed at all (a CPU: the kernels run in the Triton interpreter) the
  line is left out of the maximum, and :attr:`ExerciseScore.unavailable` says how many points and why, for
  the reports to say so.

Any integrity flag (PyTorch compute, no own kernel, inputs modified, aliasing, replayed results, wrong
outputs while timed) zeroes the whole part; a flag on the speed measurement alone (timers replaced, times
beyond the GPU's physical limits) zeroes its speed credit. A part that needs a regrade (a grader fault) scores nothing
and fails nothing: its lines say "needs regrade" and count towards ``pending``, not the score.

An exercise's declared points are multiplied by its weight, and every exercise is scaled by one factor so
that the course adds up to ``[course] total``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from grader.checks.spec import Exercise, ExtraCheck, Part
from grader.checks.text import plural
from grader.grading.config import Course
from grader.grading.results.results import GRADED, NEEDS_REGRADE, PASSED, ExerciseResult, PartResult, SpeedResult

LINE_PASSED, LINE_FAILED, LINE_REGRADE = "passed", "failed", "needs regrade"
SPEED_NEEDS_GPU = "speed is measured on a GPU only (here the kernels ran in the Triton interpreter)"


@dataclass
class Unavailable:
    """Points a part could not earn on this device, left out of the maximum."""

    part: str
    points: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Line:
    """One line of the gradebook (one Gradescope test)."""

    exercise: str
    part: str
    component: str  # "correctness" | an extra check's name | "speed"
    name: str
    score: float
    max_score: float
    status: str  # LINE_PASSED | LINE_FAILED | LINE_REGRADE
    output: str

    @property
    def passed(self) -> bool:
        return self.status == LINE_PASSED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ExerciseScore:
    exercise: str
    title: str
    status: str
    message: str
    lines: list[Line]
    unavailable: list[Unavailable] = field(default_factory=list)

    @property
    def unavailable_points(self) -> float:
        return sum(u.points for u in self.unavailable)

    @property
    def score(self) -> float:
        return sum(line.score for line in self.lines if line.status != LINE_REGRADE)

    @property
    def max_score(self) -> float:
        return sum(line.max_score for line in self.lines)

    @property
    def pending(self) -> float:
        """Points waiting for a regrade."""
        return sum(line.max_score for line in self.lines if line.status == LINE_REGRADE)

    def to_dict(self) -> dict[str, Any]:
        return {"exercise": self.exercise, "title": self.title, "status": self.status, "message": self.message,
                "score": self.score, "max_score": self.max_score, "pending": self.pending,
                "lines": [line.to_dict() for line in self.lines],
                "unavailable": [u.to_dict() for u in self.unavailable]}


def _correctness_fraction(part: PartResult, mode: str) -> float:
    checks = part.correctness
    if not checks:
        return 0.0
    if mode == "all-or-nothing":
        return 1.0 if all(c.passed for c in checks) else 0.0
    return part.passed_cases / len(checks)


def _status(ok: bool) -> str:
    return LINE_PASSED if ok else LINE_FAILED


def speed_measurable(result: ExerciseResult) -> bool:
    """Whether this run's device could measure speed (a GPU): otherwise speed points are not available."""
    return result.device.get("kind") == "cuda"


def score_part(exercise: Exercise, spec: Part, part: PartResult, factor: float, course: Course,
               measurable: bool = False) -> list[Line]:
    """The correctness, extra-check and speed lines of one part, in course points; on a device that measures
    speed (``measurable``) the speed line is there even where the student's code was not measured (0)."""
    lines = [_correctness_line(exercise, spec, part, factor, course)]
    lines += [_extra_line(exercise, spec, part, factor, extra) for extra in spec.extra_checks]
    speed = part.speed
    # no speed line where the device cannot measure it (a CPU); the reports say why
    if spec.speed_graded and (measurable or speed.fraction is not None or speed.status == NEEDS_REGRADE
                              or part.status == NEEDS_REGRADE):
        lines.append(_speed_line(exercise, spec, part, factor))
    return lines


def _flag_text(flags: list[dict]) -> str:
    return "\n".join(f"[{f['rule']}] {f['message']}" for f in flags)


def _correctness_line(exercise: Exercise, spec: Part, part: PartResult, factor: float, course: Course) -> Line:
    title, max_c = f"{exercise.name} / {spec.name}", spec.points * factor
    if part.status == NEEDS_REGRADE:
        return Line(exercise.name, spec.name, "correctness", f"{title}: correctness", 0.0, max_c, LINE_REGRADE,
                    part.message)
    graded = part.status == GRADED
    flagged = bool(part.part_flags) and graded
    n, total = part.passed_cases, len(part.correctness)
    fraction = _correctness_fraction(part, course.correctness) if graded and not flagged else 0.0
    if not graded:
        output = part.message
    elif flagged:
        output = f"zeroed by an integrity flag:\n{_flag_text(part.part_flags)}"
    else:
        output = _correctness_output(part, n, total)
    counts = f" ({n}/{total} checks)" if graded else ""
    return Line(exercise.name, spec.name, "correctness", f"{title}: correctness{counts}", max_c * fraction, max_c,
                _status(graded and not flagged and fraction == 1.0), output)


def _correctness_output(part: PartResult, n: int, total: int) -> str:
    """How many checks passed, the smallest failing one, the hints the failures share, and every check."""
    output = f"{n} of {plural(total, 'check')} passed"
    failure = part.first_failure()
    if failure:
        output += f"\nsmallest failing check ({failure.label}):\n{failure.message}"
    hint = part.layout_hint()
    if hint:
        output += f"\nhint, from all {total} checks: {hint}"
    common = part.common_hint()
    if common:
        output += f"\nhint, from {common[1]} of {common[2]} failing checks: {common[0]}"
    if failure:
        output += "\nevery check:" + "".join(
            f"\n  {kind}: " + "; ".join(f"{'passed' if c.passed else 'FAILED'} {c.label}"
                                        + ("" if c.passed else f" ({c.reason})") for c in checks)
            for kind, checks in part.checks_by_kind())
    return output


def _extra_line(exercise: Exercise, spec: Part, part: PartResult, factor: float, extra: ExtraCheck) -> Line:
    max_x, name = extra.points * factor, f"{exercise.name} / {spec.name}: {extra.name}"
    if part.status == NEEDS_REGRADE:
        return Line(exercise.name, spec.name, extra.name, name, 0.0, max_x, LINE_REGRADE, part.message)
    graded = part.status == GRADED
    flagged = bool(part.part_flags) and graded
    check = next((c for c in part.checks if c.role == extra.name), None)
    ok = graded and not flagged and check is not None and check.status == PASSED
    if not graded:
        output = part.message
    elif flagged:
        output = f"zeroed by an integrity flag:\n{_flag_text(part.part_flags)}"
    elif check is None:
        output = f"{extra.description}: not run"
    else:
        output = f"{extra.description}: " + ("ok" if ok else check.message)
    return Line(exercise.name, spec.name, extra.name, name, max_x if ok else 0.0, max_x, _status(ok), output)


def _speed_line(exercise: Exercise, spec: Part, part: PartResult, factor: float) -> Line:
    speed: SpeedResult = part.speed
    max_s, name = spec.speed_points * factor, f"{exercise.name} / {spec.name}: speed"
    if part.status == NEEDS_REGRADE or speed.status == NEEDS_REGRADE:
        return Line(exercise.name, spec.name, "speed", name, 0.0, max_s, LINE_REGRADE, speed.message or part.message)
    graded = part.status == GRADED
    speed_flagged = bool(part.flags) and graded
    got = 0.0 if speed_flagged or not graded else max_s * float(speed.fraction or 0.0)
    output = speed.message
    if speed_flagged:
        output = f"zeroed by an integrity flag:\n{_flag_text(part.flags)}\n{output}"
    return Line(exercise.name, spec.name, "speed", name, got, max_s, _status(got >= max_s - 1e-9), output)


def score_exercise(exercise: Exercise, result: ExerciseResult, course: Course,
                   exercises: Iterable[Exercise]) -> ExerciseScore:
    factor = course.factor(exercise, exercises)
    by_name = {p.name: p for p in result.parts}
    measurable = speed_measurable(result)
    lines: list[Line] = []
    unavailable: list[Unavailable] = []
    for spec in exercise.parts:
        part = by_name.get(spec.name) or PartResult(spec.name, "error", result.message or "not graded")
        part_lines = score_part(exercise, spec, part, factor, course, measurable)
        if spec.speed_graded and not any(line.component == "speed" for line in part_lines):
            unavailable.append(Unavailable(spec.name, spec.speed_points * factor, SPEED_NEEDS_GPU))
        lines.extend(part_lines)
    return ExerciseScore(exercise.name, exercise.title, result.status, result.message, lines, unavailable)


def round_points(value: float) -> float:
    return round(value + 0.0, 2)


def points_text(value: float) -> str:
    """Points as reports print them: ``13.89``, ``100``, ``0``."""
    return f"{round_points(value):g}"
