"""GPU acceptance of speed grading (``pytest -m gpu``): with this GPU's thresholds (the shipped file, or a
calibration made on the spot where there is none), every reference solution earns full speed credit in each of
RUNS measurements and every slowed fixture (tests/slow_fixtures) loses it in each; a result cached across calls is
caught; and the product commands a course team runs on a GPU work: ``grader bench`` (table, roofline chart,
leaderboard), ``grader calibrate`` and the students' ``pytest -m speed``. Skipped on a CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grader import cli, exercises
from grader.checks import loader, verdicts
from grader.checks.spec import Exercise, Part
from grader.grading import config
from grader.grading.commands import calibrate
from grader.speed import credit, in_process, measure
from grader.speed.thresholds import calibrated, gpu_files

from .. import known_wrong

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
RUNS = 3  # measurements per implementation: the reference must earn full credit in every one
FIXTURE_BUDGET_S = 2.0  # the slowed fixtures are far off: a short measurement shows it


def _speed_parts() -> list:
    return [pytest.param(e, p, id=f"{e.name}.{p.name}") for e, p in calibrate.speed_parts()]


def _slowed(exercise: Exercise, part: Part) -> list[known_wrong.Fixture]:
    return [f for f in known_wrong.slowed() if f.exercise == exercise.name and part.name in f.slower]


def test_every_slowed_fixture_is_for_a_speed_graded_part():
    """On any machine: a slowed fixture that names no speed-graded part would be measured by nothing."""
    graded = {(e.name, p.name) for e, p in calibrate.speed_parts()}
    for fixture in known_wrong.slowed():
        assert fixture.slower and {(fixture.exercise, s) for s in fixture.slower} <= graded, fixture.id


@pytest.fixture(scope="module")
def shipped() -> calibrated.Thresholds | None:
    return credit.load_thresholds()


def _thresholds(exercise: Exercise, part: Part, shipped: calibrated.Thresholds | None) -> calibrated.Thresholds:
    """This GPU's file when it covers the part; else a calibration of the part made here."""
    if shipped is not None and all(shipped.get(exercise.name, part.name, b.label) for b in part.benchmarks):
        return shipped
    result, _ = calibrate.calibrate(parts=[(exercise, part)], impl_root=SOLUTIONS, repeats=3, budget_s=1.0,
                                    recheck=False)
    return result


def _credit(part: Part, module, limits: calibrated.Thresholds, budget_s: float) -> credit.SpeedCredit:
    """One speed grading of the part, as the grader times it: the recorded kernels replayed (the recheck on
    fresh inputs is judged elsewhere)."""
    per_benchmark = budget_s / len(part.benchmarks)
    rows = [in_process.measure_replayed(part, module, bench, budget_s=per_benchmark) for bench in part.benchmarks]
    measurement = measure.SpeedMeasurement(torch.cuda.get_device_name(), rows)
    return credit.part_credit(part, measurement, recheck=verdicts.Verdict(True), thresholds=limits)


@pytest.mark.gpu
@pytest.mark.parametrize(("exercise", "part"), _speed_parts())
def test_the_reference_earns_full_speed_credit_and_slowed_fixtures_lose_it(exercise, part, shipped):
    limits = _thresholds(exercise, part, shipped)
    budget_s = config.load_course().setting("speed_budget_s", "cuda")  # what grading gives a part
    problems = []
    reference = loader.load(SOLUTIONS, exercise, part.functions)
    for run in range(RUNS):
        scored = _credit(part, reference, limits, budget_s)
        assert scored.calibrated, scored.message  # judged against this GPU's own thresholds
        if scored.fraction < 1.0:
            problems.append(f"the reference, run {run + 1} of {RUNS}: {scored.message}")
    for fixture in _slowed(exercise, part):
        module = loader.load(known_wrong.tree_or_fail(fixture), exercise, part.functions)
        for run in range(RUNS):
            scored = _credit(part, module, limits, FIXTURE_BUDGET_S)
            if scored.fraction >= 1.0:
                problems.append(f"the slowed fixture {fixture.id}, run {run + 1} of {RUNS}, earned full credit: "
                                f"{scored.message}")
    assert not problems, "\n\n".join(problems)


@pytest.mark.gpu
def test_a_result_cached_across_calls_is_caught():
    gelu = exercises.get("gelu")
    part = gelu.part("forward")
    reference = loader.load(SOLUTIONS, gelu, part.functions)
    cache: dict = {}
    def gelu(x):
        if tuple(x.shape) not in cache:
            cache[tuple(x.shape)] = reference.gelu(x)
        return cache[tuple(x.shape)]

    cheat = SimpleNamespace(gelu=gelu)
    row = in_process.measure_replayed(part, cheat, part.benchmarks[0], budget_s=0.3)
    assert row.error and "launched no Triton kernel" in row.error


@pytest.mark.gpu
def test_grader_bench_shows_the_baselines_and_draws_the_roofline(tmp_path, capsys):
    plot, data = tmp_path / "gelu.svg", tmp_path / "gelu.json"
    assert cli.main(["bench", "gelu", "--impl", str(SOLUTIONS), "--budget-s", "0.3", "--plot", str(plot),
                     "--json", str(data)]) == 0
    out = capsys.readouterr().out
    for expected in ("gelu · forward on", "torch.compile", "copy", "% roofline", "yours ×", "roofline: copy"):
        assert expected in out, out
    assert plot.read_text().startswith("<svg") and 'class="point"' in plot.read_text()
    assert '"device": "CUDA on' in data.read_text()


@pytest.mark.gpu
def test_grader_bench_leaderboard(capsys):
    assert cli.main(["bench", "flash_attention", "--impl", str(SOLUTIONS), "--leaderboard", "--rounds", "2",
                     "--budget-s", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "CS336 leaderboard" in out and "cs336-h16-n16384-d64-causal" in out and "sdpa-flash" in out
    assert "yours rounds:" in out


@pytest.mark.gpu
def test_grader_calibrate_writes_this_gpus_file(tmp_path):
    assert cli.main(["calibrate", "gelu", "--out", str(tmp_path), "--repeats", "1", "--budget-s", "0.3"]) == 0
    (written,) = tmp_path.glob("*.toml")
    loaded = gpu_files.load(written)
    assert {b.label for b in exercises.get("gelu").part("forward").benchmarks} == {
        label for (exercise, _, label) in loaded.entries if exercise == "gelu"}


@pytest.mark.gpu
def test_students_speed_tests_pass_on_the_reference(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "assignments/gelu", "--impl", "solutions", "-m", "speed", "-q",
         "-p", "no:cacheprovider", f"--benchmark-json={tmp_path / 'speed.json'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout and (tmp_path / "speed.json").is_file()
