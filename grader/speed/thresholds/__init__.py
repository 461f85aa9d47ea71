"""Speed thresholds per GPU model: ``grader/speed/thresholds/<slug>.toml``, written by ``grader calibrate``.

A file holds, for every (exercise, part, benchmark), the reference solution's and the baseline's
times measured side by side on that GPU, and the speed required of a student — *relative to the
baseline measured in the same run*, so that a slower or noisier machine moves both sides:

    ratio  = baseline_ms / student_ms          (how fast the student is, in baselines)
    credit = 1                                  if ratio >= full
           = (ratio - partial) / (full - partial) if partial < ratio < full
           = 0                                  if ratio <= partial

The format, the GPU-name-to-file mapping and how to recalibrate are in README.md next to this file.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

FORMAT = 1
DIRECTORY = Path(__file__).resolve().parent
ENV_OVERRIDE = "GRADER_THRESHOLDS"  # path of a thresholds file to use whatever the GPU

# The course's default credit rule against the reference solution timed in the same rounds (the yardstick): full
# credit from this fraction of the reference's speed (room for the reference's own noise, and a kernel about 15 %
# slower loses some), none at or below half of it. A course's [speed_curve] with of = "reference" replaces both.
FULL_FRACTION = 0.92
PARTIAL_FRACTION = 0.5

# Uncalibrated entries that no shipped file covers either: generous, and said to be uncalibrated.
DEFAULT_FULL = 0.5
DEFAULT_PARTIAL = 0.25

_ENTRY_KEYS = {"baseline", "reference_ms", "baseline_ms", "reference_ratio", "ratio_cv", "full", "partial"}
_REQUIRED = ("baseline", "reference_ms", "baseline_ms", "full", "partial")


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


# --------------------------------------------------------------------------------------------
# GPU name -> file
# --------------------------------------------------------------------------------------------

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


def path_for(gpu_name: str, directory: Path = DIRECTORY) -> Path:
    return Path(directory) / f"{slug(gpu_name)}.toml"


def find(gpu_name: str, directory: Path = DIRECTORY) -> Thresholds | None:
    """The thresholds for this GPU: ``$GRADER_THRESHOLDS`` if set, else ``<directory>/<slug>.toml``;
    None if there is no such file (the GPU is not calibrated). An invalid file is an error."""
    override = os.environ.get(ENV_OVERRIDE, "").strip()
    if override:
        path = Path(override)
        if not path.is_file():
            raise ThresholdsError(f"{ENV_OVERRIDE}={override}: no such file")
        return load(path)
    path = path_for(gpu_name, directory)
    return load(path) if path.is_file() else None


def calibrated_files(directory: Path = DIRECTORY) -> list[Path]:
    return sorted(p for p in Path(directory).glob("*.toml"))


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def load(path: str | os.PathLike) -> Thresholds:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ThresholdsError(f"{display_path(path)}: cannot read: {exc.strerror or exc}") from None
    return parse(text, source=path)


def parse(text: str, *, source: str | os.PathLike = "<string>") -> Thresholds:
    where = display_path(source)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ThresholdsError(f"{where}: not valid TOML: {exc}") from None
    fmt = data.get("format")
    if fmt != FORMAT:
        raise ThresholdsError(f"{where}: 'format' must be {FORMAT} (got {fmt!r}); recalibrate with `grader calibrate`")
    gpu = data.get("gpu")
    if not isinstance(gpu, dict) or not isinstance(gpu.get("name"), str) or not gpu["name"].strip():
        raise ThresholdsError(f"{where}: [gpu] needs a 'name' (the device name it was calibrated on)")
    copy_gbps = gpu.get("copy_gbps")
    if copy_gbps is not None:
        copy_gbps = _positive(copy_gbps, f"{where}: gpu.copy_gbps")
    matmul = gpu.get("matmul_tflops", {})
    if not isinstance(matmul, dict):
        raise ThresholdsError(f"{where}: gpu.matmul_tflops must be a table of dtype = TFLOP/s")
    matmul = {k: _positive(v, f"{where}: gpu.matmul_tflops.{k}") for k, v in matmul.items()}
    table = data.get("thresholds", {})
    if not isinstance(table, dict):
        raise ThresholdsError(f"{where}: 'thresholds' must be a table")
    entries: dict[Key, Threshold] = {}
    for exercise, parts in table.items():
        if not isinstance(parts, dict):
            raise ThresholdsError(f"{where}: thresholds.{exercise} must be a table of parts")
        for part, benches in parts.items():
            if not isinstance(benches, dict):
                raise ThresholdsError(f"{where}: thresholds.{exercise}.{part} must be a table of benchmarks")
            for label, entry in benches.items():
                name = f'{where}: thresholds.{exercise}.{part}."{label}"'
                entries[(exercise, part, label)] = _entry(entry, name)
    meta = {k: v for k, v in gpu.items() if k not in ("name", "copy_gbps", "matmul_tflops")}
    meta.update({k: v for k, v in data.items() if k not in ("format", "gpu", "thresholds")})
    return Thresholds(gpu["name"], entries, Path(source) if source != "<string>" else None, copy_gbps, matmul, meta)


def _entry(entry: Any, name: str) -> Threshold:
    if not isinstance(entry, dict):
        raise ThresholdsError(f"{name} must be a table")
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise ThresholdsError(f"{name}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_ENTRY_KEYS))})")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise ThresholdsError(f"{name}: missing {', '.join(missing)}")
    if not isinstance(entry["baseline"], str) or not entry["baseline"]:
        raise ThresholdsError(f"{name}: 'baseline' must be the name of a baseline")
    values = {k: _positive(entry[k], f"{name}.{k}") for k in _ENTRY_KEYS - {"baseline"} if k in entry}
    if values["partial"] >= values["full"]:
        raise ThresholdsError(
            f"{name}: 'partial' ({values['partial']}) must be below 'full' ({values['full']}): "
            "partial is the ratio where credit starts, full the ratio for full credit"
        )
    return Threshold(
        baseline=entry["baseline"],
        reference_ms=values["reference_ms"],
        baseline_ms=values["baseline_ms"],
        full=values["full"],
        partial=values["partial"],
        reference_ratio=values.get("reference_ratio"),
        ratio_cv=values.get("ratio_cv"),
    )


def _positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ThresholdsError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not name.endswith("ratio_cv")):
        raise ThresholdsError(f"{name} must be a positive finite number, got {value!r}")
    return value


def display_path(path: str | os.PathLike) -> str:
    text = str(path)
    try:
        return os.path.relpath(text) if os.path.isabs(text) and not os.path.relpath(text).startswith("..") else text
    except ValueError:  # a different drive on Windows
        return text


# --------------------------------------------------------------------------------------------
# Writing (by hand: the format is small and a TOML writer is not in the standard library)
# --------------------------------------------------------------------------------------------


def _string(value: str) -> str:
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _string(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ThresholdsError(f"cannot write the non-finite number {value}")
        return repr(round(value, 6)) if abs(value) >= 1e-3 else f"{value:.6g}"
    if isinstance(value, str):
        return _string(value)
    raise ThresholdsError(f"cannot write {value!r} to a thresholds file")


def dumps(thresholds: Thresholds, *, header: Iterable[str] = ()) -> str:
    lines = [f"# {line}" if line else "#" for line in header]
    lines += [f"format = {FORMAT}", "", "[gpu]", f"name = {_string(thresholds.gpu)}"]
    if thresholds.copy_gbps is not None:
        lines.append(f"copy_gbps = {_value(thresholds.copy_gbps)}")
    simple_meta = {k: v for k, v in thresholds.meta.items() if not isinstance(v, dict)}
    lines += [f"{_key(k)} = {_value(v)}" for k, v in simple_meta.items()]
    if thresholds.matmul_tflops:
        lines += ["", "[gpu.matmul_tflops]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in sorted(thresholds.matmul_tflops.items())]
    for key, table in thresholds.meta.items():
        if isinstance(table, dict):
            lines += ["", f"[{_key(key)}]"] + [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    for (exercise, part, label), t in sorted(thresholds.entries.items()):
        lines += ["", f"[thresholds.{_key(exercise)}.{_key(part)}.{_string(label)}]"]
        lines.append(f"baseline = {_string(t.baseline)}")
        for k in ("reference_ms", "baseline_ms", "reference_ratio", "ratio_cv", "full", "partial"):
            v = getattr(t, k)
            if v is not None:
                lines.append(f"{k} = {_value(v)}")
    return "\n".join(lines) + "\n"


def write(thresholds: Thresholds, path: str | os.PathLike, *, header: Iterable[str] = ()) -> Path:
    path = Path(path)
    text = dumps(thresholds, header=header)
    parse(text, source=path)  # never write a file we could not read back
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------
# Uncalibrated GPUs
# --------------------------------------------------------------------------------------------


def portable(directory: Path = DIRECTORY) -> tuple[dict[Key, Threshold], list[str]]:
    """For a GPU without a file: per entry, the most lenient requirement among the calibrated GPUs
    (ratios are relative to a baseline measured on the same GPU, so they carry over roughly).
    Returns the entries and the slugs of the files used; invalid files are skipped."""
    merged: dict[Key, Threshold] = {}
    used = []
    for path in calibrated_files(directory):
        try:
            t = load(path)
        except ThresholdsError:
            continue
        used.append(path.stem)
        for key, entry in t.entries.items():
            old = merged.get(key)
            if old is None or old.baseline != entry.baseline:
                merged[key] = entry if old is None else old
                continue
            merged[key] = Threshold(
                baseline=entry.baseline,
                reference_ms=min(old.reference_ms, entry.reference_ms),
                baseline_ms=min(old.baseline_ms, entry.baseline_ms),
                full=min(old.full, entry.full),
                partial=min(old.partial, entry.partial),
            )
    return merged, used


def default(baseline: str) -> Threshold:
    return Threshold(baseline=baseline, reference_ms=math.nan, baseline_ms=math.nan,
                     full=DEFAULT_FULL, partial=DEFAULT_PARTIAL)
