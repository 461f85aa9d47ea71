"""What calibrating a GPU gives: per (exercise, part, benchmark) a :class:`Threshold` (the reference's and the
baseline's times measured side by side, and the ratios for full and partial credit), per GPU model
:class:`Thresholds`; the credit rule between two ratios (:func:`credit`); and the file stem a GPU's name maps to
(:func:`slug`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ThresholdsError(ValueError):
    """A thresholds file is missing, unreadable or invalid; the message names the file and the key."""


@dataclass(frozen=True)
class Threshold:
    baseline: str  # the baseline the ratios are relative to (the part's speed_baseline)
    reference_ms: float  # the reference solution's median time at calibration
    baseline_ms: float  # the baseline's median time in the same runs
    full: float  # ratio (baseline_ms / student_ms) for full credit
    partial: float  # ratio at or below which the credit is zero
    reference_ratio: float | None = None  # baseline_ms / reference_ms at calibration
    ratio_cv: float | None = None  # spread of the reference's ratio over the calibration repeats

    def credit(self, ratio: float) -> float:
        return credit(ratio, self.full, self.partial)


def credit(ratio: float, full: float, partial: float) -> float:
    """Linear between ``partial`` (0) and ``full`` (1), clamped."""
    if not (math.isfinite(ratio) and ratio > 0):
        return 0.0
    if ratio >= full:
        return 1.0
    if ratio <= partial:
        return 0.0
    return (ratio - partial) / (full - partial)


Key = tuple[str, str, str]  # (exercise, part, benchmark label)


@dataclass(frozen=True)
class Thresholds:
    gpu: str  # the exact device name it was calibrated on
    entries: Mapping[Key, Threshold]
    path: Path | None = None
    copy_gbps: float | None = None
    matmul_tflops: Mapping[str, float] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)  # calibrated_at, versions, margins, ...

    def get(self, exercise: str, part: str, label: str) -> Threshold | None:
        return self.entries.get((exercise, part, label))

    @property
    def slug(self) -> str:
        return slug(self.gpu)

    @property
    def where(self) -> str:
        return display_path(self.path) if self.path else f"<{self.slug}>"


_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct"}
_MEMORY_WORD = re.compile(r"^(\d+gb|hbm\d*e?|gddr\d+x?)$")
_DEFAULT_FORM = re.compile(r"^sxm\d*$")  # SXM is the default form factor: "h100", not "h100-sxm5"


def slug(gpu_name: str) -> str:
    """File stem for a GPU model: lower case, vendor words, memory size/type and the default SXM
    form factor dropped, the rest joined by '-'. "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA H100 PCIe" -> "h100-pcie", "NVIDIA H200" -> "h200", "NVIDIA A100-SXM4-80GB" -> "a100"."""
    words = [w for w in re.split(r"[^a-z0-9]+", gpu_name.lower()) if w]
    kept = [w for w in words if w not in _VENDOR_WORDS and not _MEMORY_WORD.match(w) and not _DEFAULT_FORM.match(w)]
    if not kept:
        raise ThresholdsError(f"cannot make a thresholds file name from the GPU name {gpu_name!r}")
    return "-".join(kept)


def display_path(path: str | os.PathLike) -> str:
    """``path`` as messages name it: relative to the working directory where it lies below it."""
    text = str(path)
    try:
        return os.path.relpath(text) if os.path.isabs(text) and not os.path.relpath(text).startswith("..") else text
    except ValueError:  # a different drive on Windows
        return text
