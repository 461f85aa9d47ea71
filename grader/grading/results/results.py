"""What grading one exercise produces, as typed records with ``to_dict`` / ``from_dict`` (the results are
stored as JSON in the output folder, so a batch can be resumed, regraded and reported on later).

Statuses:

* a check: "passed", "failed", "skipped" (not run on this device: the reason is the message) or
  "grader error" (the grader failed while judging it: never the student's failure);
* a part: "graded", "not implemented", "not submitted", "error" (the module cannot be used) or
  "needs regrade" (a grader error touched it: it is neither scored 0 nor counted as passed);
* speed: "measured", "not measured" (no GPU, not reached), "not graded" (the part has no speed points),
  "failed" (no credit: an error), "flagged" (no credit: the measurement cannot be trusted — timers
  replaced, times beyond the GPU's physical limits) or "needs regrade" (a grader fault, a GPU without
  calibrated thresholds, or a GPU not running as calibrated).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from grader.checks.compare import HINT_SUPPORT, hint_kind, layout_hint, supported_hints
from grader.speed import credit
from grader.speed.credit import NOT_GRADED, BenchmarkCredit

PASSED, FAILED, SKIPPED, GRADER_ERROR = "passed", "failed", "skipped", "grader error"
GRADED, NOT_IMPLEMENTED, NOT_SUBMITTED, ERROR = "graded", "not implemented", "not submitted", "error"
NEEDS_REGRADE = credit.NEEDS_REGRADE  # a part, or its speed, waits for a regrade: one word for both

UNREADABLE = "the submission could not be read: "  # an exercise result's message when nothing could be read


def ungradable(problems: list[str], results: list[ExerciseResult]) -> str | None:
    """Why nothing of a submission was graded, in one line: it could not be read, or it holds no exercise module
    of those being graded. None when at least one exercise was there to grade."""
    if not results or any(r.status not in (NOT_SUBMITTED, ERROR) for r in results):
        return None
    unreadable = [r for r in results if r.status == ERROR and r.message.startswith(UNREADABLE)]
    if len(unreadable) + sum(r.status == NOT_SUBMITTED for r in results) != len(results):
        return None  # an exercise that was there and failed: graded
    if problems:
        return "; ".join(p.splitlines()[0] for p in problems)
    return ("nothing to grade: no module of " + ", ".join(r.exercise for r in results)
            + " (expected files like <exercise>/<exercise>.py)")


CORRECTNESS_ROLES = ("example", "random", "bad_input")
INTEGRITY_ROLES = ("integrity", "fresh")


@dataclass
class GraderError:
    """An exception on the grader's side (judging, comparing, scoring, reporting): the traceback is for staff."""

    where: str  # the check id, part or step
    error: str  # "TypeError: ..." (one line)
    traceback: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraderError:
        return cls(**data)


@dataclass
class CheckResult:
    """One graded check: a correctness case, a bad input, an integrity case, an extra check, ..."""

    id: str  # the plan item's id, e.g. "forward.examples[shape=1021-...]", "forward.random[3]"
    role: str  # "example" | "random" | "integrity" | "fresh" | "bad_input" | an extra check's name
    label: str
    status: str  # PASSED | FAILED | SKIPPED | GRADER_ERROR
    message: str = ""
    case: dict | None = None
    size: int | None = None  # elements in the inputs: the smallest failing case is shown first
    contiguous: bool | None = None  # a correctness case: were all its tensor inputs contiguous?

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def reason(self) -> str:
        """Why it failed, in one line: the first mismatch count or exception of its message."""
        lines = [ln.strip() for ln in self.message.splitlines() if ln.strip()]
        found = next((ln for ln in lines if " differ" in ln or "raised" in ln or "never written" in ln), None)
        return found or (lines[0] if lines else self.status)

    def hints(self) -> list[str]:
        """The hints its message gives (``hint: ...`` lines)."""
        return [ln.strip()[len("hint: "):] for ln in self.message.splitlines() if ln.strip().startswith("hint: ")]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckResult:
        return cls(**data)


@dataclass
class SpeedResult:
    status: str  # one of grader.speed.credit's statuses: MEASURED, NOT_MEASURED, NOT_GRADED, FAILED, FLAGGED, ...
    message: str = ""
    fraction: float | None = None  # credit in [0, 1] where measured (0 where failed)
    rows: list[BenchmarkCredit] = field(default_factory=list)  # per benchmark
    calibrated: bool = False
    roofline: dict[str, Any] = field(default_factory=dict)
    gpu_state: list[dict[str, Any]] = field(default_factory=list)  # the GPU before and after the timed rounds

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rows": [row.to_dict() for row in self.rows]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeedResult:
        return cls(**{**data, "rows": [BenchmarkCredit.from_dict(row) for row in data.get("rows", [])]})


@dataclass
class PartResult:
    name: str
    status: str  # GRADED | NOT_IMPLEMENTED | NOT_SUBMITTED | ERROR | NEEDS_REGRADE
    message: str = ""
    checks: list[CheckResult] = field(default_factory=list)
    # {"rule", "message", "scope"}: a "part" flag zeroes the part, a "speed" flag its speed credit
    flags: list[dict[str, str]] = field(default_factory=list)
    speed: SpeedResult = field(default_factory=lambda: SpeedResult(NOT_GRADED))
    grader_errors: list[GraderError] = field(default_factory=list)

    def of_roles(self, *roles: str) -> list[CheckResult]:
        return [c for c in self.checks if c.role in roles and c.status != SKIPPED]

    @property
    def correctness(self) -> list[CheckResult]:
        return self.of_roles(*CORRECTNESS_ROLES)

    @property
    def integrity(self) -> list[CheckResult]:
        return self.of_roles(*INTEGRITY_ROLES)

    @property
    def skipped(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == SKIPPED]

    @property
    def passed_cases(self) -> int:
        return sum(c.passed for c in self.correctness)

    @property
    def needs_regrade(self) -> bool:
        return self.status == NEEDS_REGRADE or self.speed.status == NEEDS_REGRADE

    @property
    def part_flags(self) -> list[dict[str, str]]:
        """The flags that zero the whole part (the others cost the speed credit only)."""
        return [f for f in self.flags if f.get("scope", "part") == "part"]

    def checks_by_kind(self) -> list[tuple[str, list[CheckResult]]]:
        """The correctness checks in plain words, by kind: fixed examples, random cases, bad inputs."""
        kinds = (("fixed examples", "example"), ("random cases", "random"), ("bad inputs", "bad_input"))
        grouped = [(title, [c for c in self.correctness if c.role == role]) for title, role in kinds]
        return [(title, checks) for title, checks in grouped if checks]

    def common_hint(self) -> tuple[str, int, int] | None:
        """The hint the failing checks point to, with how many give that kind of hint, of how many failed: the
        kind most of them give, told only where at least a third do (one odd case is no pattern); its text is the
        smallest failing check's. A hint the other failing checks refute does not count."""
        failing = sorted((c for c in self.correctness if c.status == FAILED),
                         key=lambda c: (c.size is None, c.size or 0))
        by_kind: dict[str, list[str]] = {}
        for hints in supported_hints([check.hints() for check in failing]):
            for kind, text in {hint_kind(h): h for h in hints}.items():
                if kind is not None:
                    by_kind.setdefault(kind, []).append(text)
        if not by_kind:
            return None
        kind, texts = max(by_kind.items(), key=lambda kv: len(kv[1]))
        if len(texts) < HINT_SUPPORT * len(failing):
            return None
        return texts[0], len(texts), len(failing)

    def layout_hint(self) -> str | None:
        """What the correctness cases together suggest (failures only on non-contiguous inputs: strides)."""
        return layout_hint((c.contiguous, c.passed) for c in self.correctness if c.contiguous is not None)

    def first_failure(self) -> CheckResult | None:
        failing = [c for c in self.correctness if c.status == FAILED]
        return min(failing, key=lambda c: (c.size is None, c.size or 0)) if failing else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "speed": self.speed.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PartResult:
        data = dict(data)
        data["checks"] = [CheckResult.from_dict(c) for c in data.get("checks", [])]
        data["speed"] = SpeedResult.from_dict(data["speed"])
        data["grader_errors"] = [GraderError.from_dict(e) for e in data.get("grader_errors", [])]
        return cls(**data)


@dataclass
class ExerciseResult:
    exercise: str
    title: str
    status: str  # GRADED | NOT_SUBMITTED | NOT_IMPLEMENTED | ERROR | NEEDS_REGRADE
    message: str = ""
    parts: list[PartResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # crashes, time-outs, malformed results
    notes: list[str] = field(default_factory=list)  # for the student, not failures (a long compilation)
    grader_errors: list[GraderError] = field(default_factory=list)  # not tied to one part
    log: str = ""  # the worker's captured stdout/stderr
    elapsed_s: float = 0.0
    profile: dict[str, float] = field(default_factory=dict)  # seconds per step (grader grade --profile)
    counts: dict[str, int] = field(default_factory=dict)  # e.g. references computed / reused (--profile)
    cpu: dict[str, float] = field(default_factory=dict)  # the workers' and timer's CPU seconds per step of the run
    # that wrote it (a regrade's own, not the earlier run's): --profile
    device: dict[str, Any] = field(default_factory=dict)  # where it ran: {"kind", "name", "index", "uuid"}

    @property
    def needs_regrade(self) -> bool:
        return bool(self.grader_errors) or any(p.needs_regrade for p in self.parts)

    def regrade_parts(self) -> list[str]:
        """The parts a regrade must run again (all of them after an exercise-level grader error)."""
        if self.grader_errors:
            return [p.name for p in self.parts]
        return [p.name for p in self.parts if p.needs_regrade]

    def all_grader_errors(self) -> list[GraderError]:
        return self.grader_errors + [e for p in self.parts for e in p.grader_errors]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["parts"] = [p.to_dict() for p in self.parts]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExerciseResult:
        data = dict(data)
        data["parts"] = [PartResult.from_dict(p) for p in data.get("parts", [])]
        data["grader_errors"] = [GraderError.from_dict(e) for e in data.get("grader_errors", [])]
        return cls(**data)
