"""Thresholds files: GPU name mapping, parsing and its errors, writing, lookup, the uncalibrated
fallback, credit arithmetic and the calibration arithmetic. Also validates the shipped files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from grader import exercises
from grader.grading.commands import calibrate
from grader.speed.thresholds import calibrated, gpu_files
from grader.speed.thresholds.calibrated import Threshold, Thresholds, ThresholdsError


@pytest.mark.parametrize(("name", "slug"), [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("Tesla T4", "t4"),
])
def test_gpu_name_to_file(name, slug):
    assert calibrated.slug(name) == slug
    assert gpu_files.path_for(name, Path("/x")) == Path(f"/x/{slug}.toml")


def test_unusable_gpu_name():
    with pytest.raises(ThresholdsError, match="cannot make a thresholds file name"):
        calibrated.slug("NVIDIA 80GB")


def _thresholds(**entry) -> Thresholds:
    values = dict(baseline="torch", reference_ms=0.1, baseline_ms=0.11, full=0.935, partial=0.55,
                  reference_ratio=1.1, ratio_cv=0.01)
    values.update(entry)
    return Thresholds(
        "NVIDIA H100 80GB HBM3",
        {("gelu", "forward", "fp32-4096x8192"): Threshold(**values),
         ("matmul", "forward", '4096³ bf16 "quoted"'): Threshold(**values)},
        copy_gbps=3000.5, matmul_tflops={"bfloat16": 790.0},
        meta={"torch": "2.11.0", "calibration": {"full_margin": 0.85, "repeats": 3}},
    )


def test_write_then_parse_round_trips(tmp_path):
    original = _thresholds()
    path = gpu_files.write(original, tmp_path / "h100.toml", header=["a header", ""])
    back = gpu_files.load(path)
    assert back.gpu == original.gpu and back.entries == original.entries
    assert back.copy_gbps == 3000.5 and back.matmul_tflops == {"bfloat16": 790.0}
    assert back.meta["torch"] == "2.11.0" and back.meta["calibration"] == {"full_margin": 0.85, "repeats": 3}
    assert path.read_text().startswith("# a header\n#\nformat = 1")
    assert back.get("gelu", "forward", "fp32-4096x8192").full == 0.935
    assert back.get("gelu", "forward", "nope") is None


def test_writing_refuses_non_finite_numbers(tmp_path):
    with pytest.raises(ThresholdsError, match="non-finite"):
        gpu_files.write(_thresholds(reference_ms=math.inf), tmp_path / "x.toml")


GOOD = """
format = 1
[gpu]
name = "NVIDIA H200"
[thresholds.gelu.forward."fp32-4096x8192"]
baseline = "torch"
reference_ms = 0.1
baseline_ms = 0.1
full = 0.85
partial = 0.5
"""


def test_minimal_file_parses():
    t = gpu_files.parse(GOOD)
    assert t.gpu == "NVIDIA H200" and t.copy_gbps is None
    entry = t.get("gelu", "forward", "fp32-4096x8192")
    assert (entry.full, entry.partial, entry.reference_ratio) == (0.85, 0.5, None)


@pytest.mark.parametrize(("text", "message"), [
    ("format = 1\n[gpu\n", "not valid TOML"),
    (GOOD.replace("format = 1", ""), "'format' must be 1"),
    (GOOD.replace("format = 1", "format = 2"), "'format' must be 1"),
    (GOOD.replace('name = "NVIDIA H200"', ""), r"\[gpu\] needs a 'name'"),
    (GOOD.replace("full = 0.85", ""), r'thresholds\.gelu\.forward\."fp32-4096x8192": missing full'),
    (GOOD.replace("full = 0.85", "full = 0.85\nful = 1.0"), "unknown key.*ful"),
    (GOOD.replace("partial = 0.5", "partial = 0.9"), "'partial' .* must be below 'full'"),
    (GOOD.replace("reference_ms = 0.1", "reference_ms = -0.1"), "reference_ms must be a positive finite number"),
    (GOOD.replace("reference_ms = 0.1", "reference_ms = 0"), "reference_ms must be a positive finite number"),
    (GOOD.replace("reference_ms = 0.1", 'reference_ms = "fast"'), "reference_ms must be a number"),
    (GOOD.replace("full = 0.85", "full = true"), "full must be a number"),
    (GOOD.replace("full = 0.85", "full = nan"), "full must be a positive finite number"),
    (GOOD.replace('baseline = "torch"', "baseline = 3"), "'baseline' must be the name"),
    (GOOD + "[thresholds.softmax]\nforward = 3\n", r"thresholds\.softmax\.forward must be a table"),
    (GOOD.replace("[gpu]", "[gpu]\ncopy_gbps = -1"), "gpu.copy_gbps must be a positive"),
])
def test_invalid_files_say_where_and_what(text, message):
    with pytest.raises(ThresholdsError, match=message) as info:
        gpu_files.parse(text, source="grader/speed/thresholds/h200.toml")
    assert str(info.value).startswith("grader/speed/thresholds/h200.toml")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ThresholdsError, match="cannot read"):
        gpu_files.load(tmp_path / "nope.toml")


def test_find_by_gpu_name_and_override(tmp_path, monkeypatch):
    monkeypatch.delenv(gpu_files.ENV_OVERRIDE, raising=False)
    assert gpu_files.find("NVIDIA H200", tmp_path) is None  # not calibrated
    (tmp_path / "h200.toml").write_text(GOOD)
    assert gpu_files.find("NVIDIA H200", tmp_path).gpu == "NVIDIA H200"
    (tmp_path / "h100.toml").write_text("format = 1\n")
    with pytest.raises(ThresholdsError, match=r"h100\.toml.*\[gpu\] needs a 'name'"):
        gpu_files.find("NVIDIA H100 80GB HBM3", tmp_path)  # an invalid file is an error, not "uncalibrated"
    other = tmp_path / "custom.toml"
    other.write_text(GOOD)
    monkeypatch.setenv(gpu_files.ENV_OVERRIDE, str(other))
    assert gpu_files.find("NVIDIA A100-SXM4-80GB", tmp_path).path == other
    monkeypatch.setenv(gpu_files.ENV_OVERRIDE, str(tmp_path / "missing.toml"))
    with pytest.raises(ThresholdsError, match=r"GRADER_THRESHOLDS=.*no such file"):
        gpu_files.find("NVIDIA H200", tmp_path)


def test_portable_takes_the_most_lenient_calibrated_gpu(tmp_path):
    (tmp_path / "h200.toml").write_text(GOOD)
    (tmp_path / "h100.toml").write_text(GOOD.replace('"NVIDIA H200"', '"NVIDIA H100 80GB HBM3"')
                                        .replace("full = 0.85", "full = 0.8").replace("partial = 0.5", "partial = 0.6"))
    (tmp_path / "broken.toml").write_text("not toml [")
    entries, used = gpu_files.portable(tmp_path)
    assert used == ["h100", "h200"]
    entry = entries[("gelu", "forward", "fp32-4096x8192")]
    assert (entry.full, entry.partial) == (0.8, 0.5)
    assert gpu_files.default("torch").full == gpu_files.DEFAULT_FULL


@pytest.mark.parametrize(("ratio", "credit"), [
    (1.2, 1.0), (0.85, 1.0), (0.675, 0.5), (0.5, 0.0), (0.1, 0.0), (math.nan, 0.0), (math.inf, 0.0), (0.0, 0.0),
])
def test_credit_is_linear_between_partial_and_full(ratio, credit):
    assert calibrated.credit(ratio, full=0.85, partial=0.5) == pytest.approx(credit)


def test_calibration_sets_requirements_from_the_reference_ratio():
    runs = [calibrate.Run(0.10, 0.11), calibrate.Run(0.10, 0.12), calibrate.Run(0.11, 0.11)]
    entry = calibrate.threshold_from_runs("torch", runs, full_margin=0.85, partial_margin=0.5)
    assert entry.reference_ratio == pytest.approx(1.1)  # median of 1.1, 1.2, 1.0
    assert entry.ratio_cv == pytest.approx(0.0909, abs=1e-3)
    # a 9% spread between the repeats: 0.85 - 2 · 0.0909 is below the floor, full credit from 0.675 × the ratio
    assert entry.full == pytest.approx(0.675 * 1.1) and entry.partial == pytest.approx(0.5 * 1.1)
    assert (entry.reference_ms, entry.baseline_ms) == (0.10, 0.11)
    assert entry.credit(1.0) == 1.0  # a reference 9 % slower than at calibration keeps full credit
    with pytest.raises(ValueError, match="margin"):
        calibrate.threshold_from_runs("torch", runs, full_margin=0.5, partial_margin=0.6)
    with pytest.raises(ValueError, match="no runs"):
        calibrate.threshold_from_runs("torch", [])


def test_full_margin_widens_with_the_spread_down_to_a_floor():
    quiet = [calibrate.Run(0.10, 0.12)] * 3
    assert calibrate.threshold_from_runs("torch", quiet).full == pytest.approx(0.92 * 1.2)  # no spread: 0.92
    assert calibrate.full_factor(0.85, 0.5, 0.02) == pytest.approx(0.81)
    assert calibrate.full_factor(0.85, 0.5, 0.5) == pytest.approx(0.675)  # never below the midpoint
    noisy = [calibrate.Run(0.10, 0.10), calibrate.Run(0.10, 0.20), calibrate.Run(0.10, 0.40)]
    entry = calibrate.threshold_from_runs("torch", noisy)
    assert entry.partial < entry.full == pytest.approx(0.71 * 2.0)  # the default margins' midpoint


def test_calibrating_some_exercises_keeps_the_others(tmp_path):
    old = _thresholds()
    new_entry = Threshold("torch", 0.2, 0.2, 0.85, 0.5)
    new = Thresholds(old.gpu, {("gelu", "forward", "fp32-4096x8192"): new_entry}, copy_gbps=2900.0)
    merged = calibrate.merge(new, old)
    assert merged.entries[("gelu", "forward", "fp32-4096x8192")] == new_entry
    assert ('matmul', 'forward', '4096³ bf16 "quoted"') in merged.entries
    assert merged.copy_gbps == 2900.0 and merged.matmul_tflops == {"bfloat16": 790.0}
    other_gpu = Thresholds("NVIDIA H200", new.entries)
    assert calibrate.merge(other_gpu, old) is other_gpu
    assert calibrate.output_path(str(tmp_path), "NVIDIA H200") == tmp_path / "h200.toml"
    assert calibrate.output_path(str(tmp_path / "x.toml"), "NVIDIA H200") == tmp_path / "x.toml"
    assert calibrate.output_path(None, "NVIDIA H200") == gpu_files.DIRECTORY / "h200.toml"


SHIPPED = gpu_files.calibrated_files()


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_thresholds_files_are_valid_and_current(path):
    """Every entry of a shipped file names an existing speed-graded benchmark, with its baseline."""
    t = gpu_files.load(path)
    assert calibrated.slug(t.gpu) == path.stem, f"{path.name} holds thresholds for {t.gpu}"
    for (exercise, part_name, label), entry in t.entries.items():
        part = exercises.get(exercise).part(part_name)
        assert label in {b.label for b in part.benchmarks}, f"{path.name}: {exercise} {part_name} has no {label!r}"
        assert entry.baseline == part.speed_baseline, f"{path.name}: {exercise} {part_name} {label}: baseline"
