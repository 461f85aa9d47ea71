"""The instructor's speed curve (the course file's ``[speed_curve]``): per exercise or part, full credit from one
ratio and none at or below another, against the part's speed baseline or as fractions of the reference solution's
speed; and the course's default curve against the reference timed in the same rounds (:data:`FULL_FRACTION`,
:data:`PARTIAL_FRACTION`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from grader.speed.thresholds.calibrated import Threshold, ThresholdsError

# The course's default credit rule against the reference solution timed in the same rounds (the yardstick): full
# credit from this fraction of the reference's speed (room for the reference's own noise, and a kernel about 15 %
# slower loses some), none at or below half of it. A course's [speed_curve] with of = "reference" replaces both.
FULL_FRACTION = 0.92
PARTIAL_FRACTION = 0.5

CURVE_OF = ("baseline", "reference")


@dataclass(frozen=True)
class Curve:
    """The instructor's speed curve for a part (the course file's ``[speed_curve]``): full credit from ``full`` and
    none at or below ``partial``, linear between, where both are ratios to the part's speed baseline
    (``of = "baseline"``) or fractions of the reference solution's calibrated ratio (``of = "reference"``)."""

    of: str
    full: float
    partial: float

    def __post_init__(self) -> None:
        if self.of not in CURVE_OF:
            raise ValueError(f"of must be one of {', '.join(CURVE_OF)}, not {self.of!r}")
        if not (0 <= self.partial < self.full):
            raise ValueError(f"need 0 <= partial < full, got full={self.full}, partial={self.partial}")

    def apply(self, threshold: Threshold) -> Threshold:
        """``threshold`` with this curve's full and partial ratios (a reference-relative curve needs the
        reference's calibrated ratio; without one the threshold stays as it is)."""
        if self.of == "baseline":
            return replace(threshold, full=self.full, partial=self.partial)
        if threshold.reference_ratio is None:
            return threshold
        return replace(threshold, full=self.full * threshold.reference_ratio,
                       partial=self.partial * threshold.reference_ratio)

    def describe(self, baseline: str) -> str:
        if self.of == "baseline":
            return f"full credit from {self.full:g}× {baseline}'s speed, none at or below {self.partial:g}×"
        return (f"full credit from {self.full:g} of the reference solution's speed, none at or below "
                f"{self.partial:g} of it")


def curve_for(curves: Mapping[str, Curve], exercise: str, part: str) -> Curve | None:
    """The curve set for a part (``"exercise.part"``), else for its exercise, else None."""
    return curves.get(f"{exercise}.{part}") or curves.get(exercise)


def curves_from_table(table: Mapping[str, Any], source: str) -> dict[str, Curve]:
    """A course file's ``[speed_curve]`` table: each key a speed-graded exercise or ``exercise.part``, each value
    ``{of = "baseline" | "reference", full = ..., partial = ...}``. Raises :class:`ThresholdsError` naming the key."""
    from grader import exercises

    graded = {e.name: {p.name for p in e.parts if p.speed_graded} for e in exercises.all_exercises()}
    curves = {}
    for key, value in table.items():
        exercise, _, part = key.partition(".")
        if exercise not in graded or (part and part not in graded[exercise]) or not graded[exercise]:
            known = ", ".join(sorted(e for e in graded if graded[e]))
            raise ThresholdsError(f"{source}: [speed_curve] {key}: not a speed-graded exercise or part (exercises: "
                                  f"{known}; a part as exercise.part)")
        if not isinstance(value, Mapping) or set(value) - {"of", "full", "partial"} or "full" not in value:
            raise ThresholdsError(f"{source}: [speed_curve] {key} must be {{ of = \"baseline\" or \"reference\", "
                                  "full = ..., partial = ... }")
        try:
            curves[key] = Curve(str(value.get("of", "reference")), float(value["full"]),
                                float(value.get("partial", 0.0)))
        except (TypeError, ValueError) as exc:
            raise ThresholdsError(f"{source}: [speed_curve] {key}: {exc}") from None
    return curves


def course_curves(path: str | os.PathLike) -> dict[str, Curve]:
    """The ``[speed_curve]`` of the course file at ``path`` (pytest's ``--grader-course``)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ThresholdsError(f"{path}: cannot read the course file: {exc}") from None
    return curves_from_table(data.get("speed_curve", {}), str(path))
