"""Points: the course configuration (course.toml) and the score of every graded check.

One place decides every number in a report:

* correctness: ``Part.points`` shared among the part's checks (examples, random cases, bad inputs) —
  ``correctness = "fraction"`` in course.toml — or earned only if all pass (``"all-or-nothing"``);
* integrity: ``Part.integrity_points`` when every integrity check passes. Any integrity flag
  (PyTorch compute, no own kernel, inputs modified, aliasing, cached results, wrong outputs while
  timed) zeroes the whole part: correctness, integrity and speed;
* speed: ``Part.speed_points`` × the fraction from ``grader.speed.score_part`` on a calibrated GPU.
  Where speed is not measured (no GPU, an uncalibrated GPU) the line is worth 0 of 0 and says why.

An exercise's declared points are multiplied by its weight and every exercise is scaled by the same
factor so that the course's points add up to ``[course] total``.
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grader.grading.runner import ExerciseResult, PartResult
from grader.spec import Exercise, Part

COURSE_FILE = Path(__file__).with_name("course.toml")
CORRECTNESS_MODES = ("fraction", "all-or-nothing")


class CourseError(ValueError):
    """course.toml is not usable (told to the instructor verbatim)."""


@dataclass
class Course:
    name: str = "Triton kernel programming"
    total: float = 100.0
    weights: dict[str, float] = field(default_factory=dict)
    correctness: str = "fraction"
    grading: dict[str, Any] = field(default_factory=dict)
    source: str = "(defaults)"

    def weight(self, exercise: str) -> float:
        return float(self.weights.get(exercise, 1.0))

    def setting(self, key: str, device: str, default: Any) -> Any:
        return self.grading.get(f"{key}_{device}", self.grading.get(key, default))

    def scale(self, exercises: tuple[Exercise, ...]) -> float:
        """Points per declared point (before the exercise's weight)."""
        weighted = sum(self.weight(e.name) * declared_max(e) for e in exercises)
        return self.total / weighted if weighted > 0 else 0.0


def load_course(path: str | Path | None = None, known: tuple[str, ...] | None = None) -> Course:
    path = Path(path) if path else COURSE_FILE
    if not path.is_file():
        if path == COURSE_FILE:
            return Course()
        raise CourseError(f"{path}: no such course file")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CourseError(f"{path} is not valid TOML: {exc}") from None
    course_table = data.get("course", {})
    weights = data.get("weights", {})
    grading = data.get("grading", {})
    course = Course(
        name=str(course_table.get("name", Course.name)),
        total=float(course_table.get("total", 100.0)),
        weights={str(k): float(v) for k, v in weights.items()},
        correctness=str(grading.get("correctness", "fraction")),
        grading=dict(grading),
        source=str(path),
    )
    if course.total <= 0:
        raise CourseError(f"{path}: [course] total must be positive, not {course.total}")
    if any(w < 0 for w in course.weights.values()):
        raise CourseError(f"{path}: weights must not be negative")
    if course.correctness not in CORRECTNESS_MODES:
        raise CourseError(f"{path}: [grading] correctness must be one of {', '.join(CORRECTNESS_MODES)}, "
                          f"not {course.correctness!r}")
    if known is not None:
        unknown = sorted(set(course.weights) - set(known))
        if unknown:  # a typo, or an exercise not written yet: say so, but grade the rest
            print(f"grader: warning: {path}: [weights] names unknown exercise(s) {', '.join(unknown)} "
                  f"(known: {', '.join(known)})", file=sys.stderr)
    return course


def declared_max(exercise: Exercise) -> float:
    return sum(p.points + p.integrity_points + p.speed_points for p in exercise.parts)


@dataclass
class Line:
    """One line of the gradebook (one Gradescope test)."""

    exercise: str
    part: str
    component: str  # "correctness" | "integrity" | "speed" | "submission"
    name: str
    score: float
    max_score: float
    passed: bool
    output: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ExerciseScore:
    exercise: str
    title: str
    status: str
    message: str
    score: float
    max_score: float
    lines: list[Line]


def _correctness_fraction(part: PartResult, mode: str) -> float:
    if not part.correctness:
        return 0.0
    if mode == "all-or-nothing":
        return 1.0 if all(c.passed for c in part.correctness) else 0.0
    return part.passed_cases / len(part.correctness)


def score_part(exercise: Exercise, spec: Part, part: PartResult, factor: float, course: Course) -> list[Line]:
    """The correctness, integrity and speed lines of one part, in course points."""
    title = f"{exercise.name} / {spec.name}"
    lines = []
    flagged = bool(part.flags)
    flag_text = "\n".join(f"[{f['rule']}] {f['message']}" for f in part.flags)
    graded = part.status == "graded"

    # correctness
    max_c = spec.points * factor
    fraction = _correctness_fraction(part, course.correctness) if graded and not flagged else 0.0
    n, total = part.passed_cases, len(part.correctness)
    if not graded:
        output = part.message
    elif flagged:
        output = f"zeroed by an integrity flag:\n{flag_text}"
    else:
        failure = part.first_failure()
        output = f"{n} of {total} checks passed"
        if failure:
            output += f"\nsmallest failing check ({failure.label}):\n{failure.message}"
    counts = f" ({n}/{total} checks)" if graded else ""
    lines.append(Line(exercise.name, spec.name, "correctness", f"{title}: correctness{counts}",
                      max_c * fraction, max_c, graded and not flagged and fraction == 1.0, output))

    # integrity
    integrity_ok = graded and not flagged and all(c.passed for c in part.integrity)
    if spec.integrity_points > 0 or graded:
        max_i = spec.integrity_points * factor
        if not graded:
            output = part.message
        elif flagged:
            output = flag_text
        elif integrity_ok:
            output = "own Triton kernel, no PyTorch compute, inputs unchanged, no aliasing, fresh results"
        else:
            output = "\n".join(c.message for c in part.integrity if not c.passed)
        lines.append(Line(exercise.name, spec.name, "integrity", f"{title}: integrity",
                          max_i if integrity_ok else 0.0, max_i, integrity_ok, output))

    # speed: no line where it was not measured (no GPU, an uncalibrated GPU); the reports say why
    speed = part.speed or {}
    frac = speed.get("fraction")
    if spec.speed_points > 0 and spec.benchmarks and frac is not None:
        max_s = spec.speed_points * factor
        got = 0.0 if flagged or not graded else max_s * float(frac)
        output = str(speed.get("message", ""))
        if flagged:
            output = "zeroed by an integrity flag\n" + output
        lines.append(Line(exercise.name, spec.name, "speed", f"{title}: speed", got, max_s,
                          got >= max_s - 1e-9, output))
    return lines


def score_exercise(exercise: Exercise, result: ExerciseResult, course: Course,
                   exercises: tuple[Exercise, ...]) -> ExerciseScore:
    factor = course.scale(exercises) * course.weight(exercise.name)
    lines: list[Line] = []
    by_name = {p.name: p for p in result.parts}
    for spec in exercise.parts:
        part = by_name.get(spec.name) or PartResult(spec.name, "error", result.message or "not graded")
        lines.extend(score_part(exercise, spec, part, factor, course))
    score = sum(line.score for line in lines)
    max_score = sum(line.max_score for line in lines)
    return ExerciseScore(exercise.name, exercise.title, result.status, result.message, score, max_score, lines)


def round_points(value: float) -> float:
    return round(value + 0.0, 2)
