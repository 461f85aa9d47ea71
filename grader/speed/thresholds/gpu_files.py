"""A GPU model's thresholds file, ``grader/speed/thresholds/<slug>.toml`` (written by ``grader calibrate``): found by
the GPU's name (or ``$GRADER_THRESHOLDS``), read and checked, written; and, for a GPU without one, the most lenient
requirement among the calibrated GPUs (:func:`portable`) or a generous default (:func:`default`). The format is in
README.md beside this module.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from grader.speed.thresholds.calibrated import Key, Threshold, Thresholds, ThresholdsError, display_path, slug

FORMAT = 1
DIRECTORY = Path(__file__).resolve().parent
ENV_OVERRIDE = "GRADER_THRESHOLDS"  # path of a thresholds file to use whatever the GPU

# Uncalibrated entries that no shipped file covers either: generous, and said to be uncalibrated.
DEFAULT_FULL = 0.5
DEFAULT_PARTIAL = 0.25

_ENTRY_KEYS = {"baseline", "reference_ms", "baseline_ms", "reference_ratio", "ratio_cv", "full", "partial"}
_REQUIRED = ("baseline", "reference_ms", "baseline_ms", "full", "partial")


# --------------------------------------------------------------------------------------------
# GPU name -> file
# --------------------------------------------------------------------------------------------


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
