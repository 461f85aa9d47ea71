"""GPU acceptance of the trusted timer (``pytest -m gpu``): every reference solution's call is recorded and its kernels
replay in the timer process (FlashAttention's host tensor descriptors, several kernels per call, two streams in its
backward) and compute the function, all of a part's benchmarks timed in one turn alone; and every cheating fixture
of tests/cheating, graded by ``grader grade``, earns no more speed credit than its honest twin (the same kernel, no
forgery). Skipped on a CPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from grader.checks import loader
from grader.grading import config
from grader.grading.commands import calibrate
from grader.grading.commands import grade as grade_cmd
from grader.grading.exercise_run import timer_process
from grader.grading.isolation import bwrap
from grader.grading.isolation.gpu_arbiter import GpuArbiter
from grader.grading.results.results import ExerciseResult
from grader.speed import measure, student_calls
from grader.speed.plan import LaunchPlan

from .. import known_wrong

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"
CONTROL = "control_2x_slow"


def _settings(tmp_path: Path) -> config.RunSettings:
    check = bwrap.check("cuda")
    return config.RunSettings(device="cuda", secret="", random_cases=0, timeout_s=600.0, call_timeout_s=120.0,
                              memory_mb=None, speed_budget_s=2.0, workdir=tmp_path,
                              sandbox=check.sandbox)


@pytest.mark.gpu
@pytest.mark.parametrize(("exercise", "part"), calibrate.speed_parts(), ids=lambda v: getattr(v, "name", v))
def test_every_reference_replays_in_the_timer_process(exercise, part, tmp_path):
    module = loader.load(SOLUTIONS, exercise, part.functions)
    plans: dict[str, LaunchPlan | str] = {}
    for bench in part.benchmarks:
        plans[bench.label], _ = student_calls.record_benchmark(part, module, bench)
        assert isinstance(plans[bench.label], LaunchPlan), f"{bench.label}: {plans[bench.label]}"
    recorded = measure.SpeedMeasurement(torch.cuda.get_device_name(),
                                        [measure.BenchmarkTiming(b.label) for b in part.benchmarks], plans=plans)
    arbiter = GpuArbiter()
    timed = timer_process.time_measurement(_settings(tmp_path), exercise.name, part.name, recorded,
                                           budget_s=0.5 * len(part.benchmarks), scratch=tmp_path / "scratch",
                                           arbiter=arbiter)
    assert arbiter.alone_count == 1  # one turn alone for all the part's benchmarks: each turn pauses the others
    assert timed.mismatches == []
    assert [r.label for r in timed.benchmarks] == [b.label for b in part.benchmarks]
    for row in timed.benchmarks:
        assert row.error is None, f"{row.label}: {row.error}"
        assert row.median(measure.STUDENT) > 0 and row.median(part.speed_baseline) > 0
        assert any(note.startswith("timed by replaying") for note in row.notes)


def _speed(out: Path, student: str) -> tuple[float, list[str], str]:
    """The GeLU speed credit of ``student``, its flags and its speed message."""
    result = ExerciseResult.from_dict(json.loads((out / "students" / student / "state" / "gelu.json").read_text()))
    part = result.parts[0]
    return part.speed.fraction or 0.0, [f["rule"] for f in part.flags], part.speed.message


@pytest.mark.gpu
def test_no_cheat_earns_more_speed_credit_than_its_honest_twin(tmp_path, capsys):
    folders = []
    for fixture in known_wrong.cheats():
        shutil.copytree(known_wrong.tree_or_fail(fixture), tmp_path / fixture.name)
        folders.append(str(tmp_path / fixture.name))
    unsandboxed = bwrap.check("cuda").sandbox is None
    options = config.GradeOptions(exercises=("gelu",), random_cases=0, secret="cheats", unsandboxed=unsandboxed)
    out = tmp_path / "out"
    grade_cmd.grade(folders, out=out, options=options)
    honest, _, _ = _speed(out, CONTROL)
    table, problems = [], []
    for folder in folders:
        name = Path(folder).name
        credit, flags, message = _speed(out, name)
        table.append(f"{name:22s} speed credit {credit:.3f}  flags: {', '.join(flags) or '-'}")
        if name != CONTROL and credit > honest + 0.02:
            problems.append(f"{name} earned {credit:.3f} of the speed credit, its honest twin {honest:.3f}: {message}")
    with capsys.disabled():
        print("\n" + "\n".join(table))
    assert not problems, "\n".join(problems)
    assert _speed(out, "detect_timing")[1] == ["replay-mismatch"]
    assert "replay-mismatch" in _speed(out, "edit_results")[1]
