"""Speed credit beside the yardstick, on a CPU: the reference solution's replay timed in the same rounds as the
student's sets the credit (no thresholds file needed), its interval says whether a boundary is still in doubt, an
unfair GPU (throttled, a yardstick that moved) waits for a regrade, and the reference's plans are recorded once per
batch and GPU and handed to the timer."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from grader import exercises
from grader.grading.config import RunSettings
from grader.grading.exercise_run import runner, supervise, yardstick_plans
from grader.grading.exercise_run.supervised_run import Run
from grader.grading.isolation import protocol
from grader.speed import credit, credit_messages, stats
from grader.speed.measure import REFERENCE, STUDENT, BenchmarkTiming, SpeedMeasurement
from grader.speed.plan import LaunchPlan
from grader.speed.thresholds.calibrated import Threshold, Thresholds
from grader.speed.thresholds.speed_curves import Curve
from grader.speed.timer import TimerJob

GPU = "NVIDIA RTX 9999"  # no thresholds file: only the yardstick can grade speed here
PART = exercises.get("gelu").parts[0]


def _stats(ms: float) -> stats.Stats:
    return stats.Stats(20, ms, ms, 0.0, ms, ms, ms, ms)


def _row(label: str, student_ms: float, reference_ms: float, baseline_ms: float = 0.1, *, spread: float = 0.0,
         drift: float = 0.0) -> BenchmarkTiming:
    point = reference_ms / student_ms
    row = BenchmarkTiming(label, {STUDENT: _stats(student_ms), REFERENCE: _stats(reference_ms),
                                  "torch": _stats(baseline_ms)}, "events", "converged", 20)
    row.yardstick = stats.RatioInterval(point, point - spread, point + spread, 20).to_dict()
    row.yardstick_drift = drift
    return row


def _measurement(student_ms: float, reference_ms: float = 0.09, **kw) -> SpeedMeasurement:
    return SpeedMeasurement(GPU, [_row(b.label, student_ms, reference_ms, **kw) for b in PART.benchmarks])


def _judge(measurement: SpeedMeasurement, **kw) -> credit.SpeedVerdict:
    return credit.judge(PART, measurement, recheck=credit.Verdict(True), thresholds=None, **kw)


def test_a_gpu_without_thresholds_grades_speed_from_the_reference_timed_beside():
    same = _judge(_measurement(0.09))
    assert same.status == credit.MEASURED and same.fraction == 1.0
    assert {r.threshold for r in same.rows} == {credit_messages.SIDE_BY_SIDE}
    assert "timed in the same rounds" in same.message and "not calibrated" not in same.message
    slowed = _judge(_measurement(0.09 / 0.87))  # 15 % slower than the reference: 0.87 of its speed
    assert slowed.status == credit.MEASURED
    assert slowed.fraction == pytest.approx((0.87 - 0.5) / (0.92 - 0.5))
    assert "0.87× the speed of the reference solution" in slowed.message
    assert _judge(_measurement(0.2)).fraction == 0.0  # under half the reference's speed


def test_the_credit_does_not_depend_on_the_baselines_time_nor_a_thresholds_file():
    """Only the reference's time matters: a GPU where the baseline runs twice as fast gives the same credit, and
    a thresholds file (made on another day or host) is not read for a benchmark timed beside the reference."""
    fast_baseline = SpeedMeasurement(GPU, [_row(b.label, 0.1, 0.09, baseline_ms=0.05) for b in PART.benchmarks])
    slow_baseline = SpeedMeasurement(GPU, [_row(b.label, 0.1, 0.09, baseline_ms=0.2) for b in PART.benchmarks])
    assert _judge(fast_baseline).fraction == pytest.approx(_judge(slow_baseline).fraction)
    stale = Thresholds(GPU, {("gelu", "forward", b.label): Threshold("torch", 0.01, 0.1, 10.0, 5.0)
                             for b in PART.benchmarks})  # would give 0 credit
    beside = credit.judge(PART, _measurement(0.09), recheck=credit.Verdict(True), thresholds=stale)
    assert beside.fraction == 1.0


def test_a_ratio_whose_interval_straddles_a_boundary_is_credited_at_its_point_and_says_so():
    verdict = _judge(_measurement(0.09 / 0.9, spread=0.05))  # 0.90 ± 0.05: 0.92 is inside
    assert all(r.straddles for r in verdict.rows)
    assert "credited at the point estimate" in verdict.message
    assert verdict.fraction == pytest.approx((0.9 - 0.5) / 0.42)
    clear = _judge(_measurement(0.09 / 0.9, spread=0.01))
    assert not any(r.straddles for r in clear.rows) and "point estimate" not in clear.message


def test_a_course_curve_applies_beside_the_reference():
    of_reference = _judge(_measurement(0.09 / 0.8), curve=Curve("reference", full=0.8, partial=0.4))
    assert of_reference.fraction == 1.0
    assert all(r.yardstick_full == pytest.approx(0.8) for r in of_reference.rows)
    # a curve against the baseline: the ratio to the baseline (0.1 / 0.2 = 0.5) decides
    of_baseline = _judge(_measurement(0.2), curve=Curve("baseline", full=1.0, partial=0.0))
    assert of_baseline.fraction == pytest.approx(0.5)


@pytest.mark.parametrize("reasons, unfair", [(["SwPowerCap"], False), (["HwThermalSlowdown"], True)])
def test_a_part_timed_while_the_gpu_throttled_waits_for_a_regrade(reasons, unfair):
    measurement = _measurement(0.09)
    measurement.gpu_state = [{"sm_mhz": 1980, "mem_mhz": 3201, "temperature_c": 60, "power_w": 650.0,
                              "reasons": reasons}, {}]
    verdict = _judge(measurement)
    assert verdict.status == (credit.NEEDS_REGRADE if unfair else credit.MEASURED)
    assert ("throttled" in verdict.message) == unfair
    assert _judge(measurement, require_calibration=False).status == credit.MEASURED  # pytest and bench: shown


def test_a_yardstick_that_moved_during_the_rounds_waits_for_a_regrade():
    moved = _judge(_measurement(0.09, drift=0.2))
    assert moved.status == credit.NEEDS_REGRADE and "moved by 20%" in moved.message
    assert _judge(_measurement(0.09, drift=0.02)).status == credit.MEASURED


def test_without_a_yardstick_an_uncalibrated_gpu_still_waits_for_a_regrade():
    plain = SpeedMeasurement(GPU, [BenchmarkTiming(b.label, {STUDENT: _stats(0.09), "torch": _stats(0.1)}, "events",
                                                   "converged", 20) for b in PART.benchmarks])
    verdict = _judge(plain)
    assert verdict.status == credit.NEEDS_REGRADE and "not timed beside it" in verdict.message


def test_paired_ratios_cancel_a_drift_that_moves_both_candidates():
    drifting = [1.0 + 0.02 * k for k in range(20)]  # the GPU slows by 40 % over the rounds
    samples = {REFERENCE: [0.9 * d for d in drifting], STUDENT: drifting}
    interval = stats.paired_ratio(samples, REFERENCE, STUDENT)
    assert interval is not None and interval.point == pytest.approx(0.9)
    assert interval.high - interval.low < 1e-9  # every round says the same
    assert stats.drift(samples[REFERENCE]) > 0.1  # while the reference's own time moved


def _plan() -> LaunchPlan:
    return LaunchPlan.from_dict(LaunchPlan(kernels=[], buffers=[], steps=[], outputs={}).to_dict())


def test_a_timer_job_carries_the_yardstick_and_the_boundaries():
    job = TimerJob("gelu", "forward", 5.0, {"a": _plan()}, yardstick={"a": _plan()}, boundaries=[0.5, 0.92])
    again = TimerJob.from_dict(job.to_dict())
    assert again == job and list(again.yardstick) == ["a"] and again.boundaries == [0.5, 0.92]
    assert TimerJob.from_dict({k: v for k, v in job.to_dict().items() if k not in ("yardstick", "boundaries")
                               }).yardstick == {}


def _settings(tmp_path: Path, **kw) -> RunSettings:
    return RunSettings(device="cuda", secret="s", random_cases=0, timeout_s=60, call_timeout_s=30, memory_mb=None,
                       speed_budget_s=5, workdir=tmp_path, yardstick=tmp_path / "solutions", **kw)


def test_the_boundaries_the_timer_stops_on_follow_the_course_curve(tmp_path):
    default = runner._Yardstick(None, "gelu", _settings(tmp_path))
    assert default.boundaries("forward") == [0.5, 0.92]
    curved = runner._Yardstick(None, "gelu", _settings(tmp_path, speed_curves={
        "gelu": Curve("reference", full=0.8, partial=0.3)}))
    assert curved.boundaries("forward") == [0.3, 0.8]
    against_baseline = runner._Yardstick(None, "gelu", _settings(tmp_path, speed_curves={
        "gelu": Curve("baseline", full=1.0, partial=0.5)}))
    assert against_baseline.boundaries("forward") == []


def test_the_reference_is_recorded_once_per_batch_and_gpu_in_a_worker_like_a_students(tmp_path, monkeypatch):
    """``grade_exercise`` asks for the yardstick of every run; the reference's speed items are recorded by one
    worker run over the solutions tree (nothing but speed items), and every run of that batch on that GPU shares
    it; another GPU records its own."""
    gelu = exercises.get("gelu")
    calls, gate = [], threading.Event()

    def fake_run(exercise, root, items, settings, **kw):
        assert kw["scratch"].is_dir() and kw["scratch"].is_relative_to(settings.workdir)  # the batch's, made
        calls.append((exercise.name, root, [i.kind for i in items], kw["defer_speed"], kw["arbiter"]))
        gate.wait(5)
        plans = {b.label: _plan() for b in items[0].part.benchmarks[1:]}  # the first benchmark not recorded
        done = protocol.SpeedDone(items[0].id, SpeedMeasurement(GPU, plans=plans))
        return Run(to_time=[(items[0], None, done)])

    monkeypatch.setattr(supervise, "run", fake_run)
    settings = _settings(tmp_path)
    slot = SimpleNamespace(device={"uuid": "GPU-1"}, name="cuda:0", env={}, gpu_name=GPU, arbiter="the slot's arbiter")
    first = yardstick_plans.start(gelu, settings=settings, slot=slot)
    second = yardstick_plans.start(gelu, settings=settings, slot=slot)
    assert first is second
    gate.set()
    found = yardstick_plans.result(first)
    assert calls == [("gelu", tmp_path / "solutions", ["speed"], True, "the slot's arbiter")]
    assert set(found.plans["forward"]) == {b.label for b in PART.benchmarks[1:]}
    assert found.problems == [f"forward: the reference's calls on {PART.benchmarks[0].label} were not recorded"]
    other = SimpleNamespace(device={"uuid": "GPU-2"}, name="cuda:1", env={}, gpu_name=GPU, arbiter=None)
    yardstick_plans.result(yardstick_plans.start(gelu, settings=settings, slot=other))
    assert len(calls) == 2
    no_gpu = replace(settings, device="cpu")
    assert yardstick_plans.start(gelu, settings=no_gpu, slot=slot) is None  # nothing to record without a GPU


def test_a_failed_recording_is_the_graders_side_and_leaves_no_yardstick(tmp_path, monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("the solutions tree is gone")

    monkeypatch.setattr(supervise, "run", broken)
    settings = _settings(tmp_path / "b")
    found = yardstick_plans.result(yardstick_plans.start(exercises.get("gelu"), settings=settings, slot=None))
    assert found.plans == {} and "the solutions tree is gone" in found.problems[0]
    notes = runner._Yardstick(None, "gelu", settings)
    notes._found = found
    assert "could not be timed beside this submission" in notes.notes()[0]
    assert notes.plans("forward") == {}


def test_on_a_gpu_the_yardstick_is_the_default_and_no_yardstick_turns_it_off(tmp_path):
    import argparse

    from grader.grading import config
    from grader.grading.commands import grade

    parser = argparse.ArgumentParser()
    grade.add_arguments(parser)

    def options(*argv):
        return grade.options_from_args(parser.parse_args(["sub", *argv]))

    assert (options().yardstick, options("--yardstick").yardstick, options("--no-yardstick").yardstick) == (
        None, True, False)
    course = config.load_course(None)

    def settings(chosen, device):
        return config.resolve(chosen, course, device=device, secret="s", workdir=tmp_path)

    assert settings(options(), "cuda").yardstick == config.default_solutions()
    assert settings(options("--yardstick"), "cuda").yardstick == config.default_solutions()
    assert settings(options("--no-yardstick"), "cuda").yardstick is None  # the GPU's thresholds file
    assert settings(options(), "cpu").yardstick is None  # no speed on a CPU


def test_a_resumed_batch_keeps_the_way_its_speed_was_credited():
    from grader.grading import config
    from grader.grading.batch import pipeline, resume

    recorded = {"course_fingerprint": "c", "device_kind": "cuda", "yardstick": True}
    assert resume.conflicts(recorded, {**recorded, "course": "x"}, "s")[1:] == []
    said = resume.conflicts(recorded, {**recorded, "course": "x", "yardstick": False}, "s")[1:]
    assert said == ["the folder's speed was credited beside the reference solutions (the yardstick); this run "
                    "would credit it against the GPU's thresholds file (--no-yardstick)"]
    # a GPU folder graded before run.json said so was credited against the thresholds files: kept that way
    older = {"course_fingerprint": "c", "device_kind": "cuda"}
    assert resume.conflicts(older, {**older, "course": "x", "yardstick": True}, "s")[1:] == [
        "the folder's speed was credited against the GPU's thresholds file (--no-yardstick); this run would credit "
        "it beside the reference solutions (the yardstick)"]
    on_cpu = {"course_fingerprint": "c", "device_kind": "cpu"}
    assert resume.conflicts(on_cpu, {**on_cpu, "course": "x", "yardstick": False}, "s")[1:] == []
    fields = {"exercises": ["gelu"], "random_cases": 0, "timeout_s": 1.0, "call_timeout_s": 1.0, "memory_mb": 1}
    assert pipeline.recorded_options({**older, **fields}, config.GradeOptions()).yardstick is False
    assert pipeline.recorded_options({**recorded, **fields}, config.GradeOptions()).yardstick is True
    assert pipeline.recorded_options({**on_cpu, **fields}, config.GradeOptions()).yardstick is None


def test_a_server_keeps_the_recording_for_the_next_upload_and_records_again_when_the_reference_changes(
        tmp_path, monkeypatch):
    gelu = exercises.get("gelu")
    recorded = []

    def fake_run(exercise, root, items, settings, **kw):
        recorded.append(settings.workdir)
        plans = {b.label: _plan() for b in items[0].part.benchmarks}
        return Run(to_time=[(items[0], None, protocol.SpeedDone(items[0].id, SpeedMeasurement(
            GPU, plans=plans)))])

    monkeypatch.setattr(supervise, "run", fake_run)
    solutions, cache = tmp_path / "solutions", tmp_path / "serve" / "yardstick"
    (solutions / "gelu").mkdir(parents=True)
    (solutions / "gelu" / "gelu.py").write_text("# the reference\n")
    slot = SimpleNamespace(device={"uuid": "GPU-1"}, name="cuda:0", env={}, gpu_name=GPU, arbiter=None)

    def upload(n):  # each upload a batch of its own: its own workspace
        settings = replace(_settings(tmp_path / f"upload{n}"), yardstick=solutions, yardstick_cache=cache)
        return yardstick_plans.result(yardstick_plans.start(gelu, settings=settings, slot=slot))

    first, second = upload(1), upload(2)
    assert len(recorded) == 1 and not first.cached and second.cached
    assert {label: p.to_dict() for label, p in second.plans["forward"].items()} == {
        label: p.to_dict() for label, p in first.plans["forward"].items()}
    (kept,) = cache.iterdir()
    assert kept.stat().st_mode & 0o077 == 0 and cache.stat().st_mode & 0o077 == 0  # owner-only
    (solutions / "gelu" / "gelu.py").write_text("# the reference, tuned again\n")
    assert not upload(3).cached and len(recorded) == 2
    kept.write_text("{not json")  # a damaged file is recorded again, not trusted
    (solutions / "gelu" / "gelu.py").write_text("# the reference\n")
    assert not upload(4).cached and len(recorded) == 3


def test_every_batch_on_a_host_keeps_its_recording_in_the_users_cache_folder(tmp_path, monkeypatch):
    """Later batches on the GPU are timed beside the kernels recorded the first time; a server's folder is the one
    it names."""
    from types import SimpleNamespace

    from grader.grading import config
    from grader.grading.batch import context

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    work = SimpleNamespace(dir=tmp_path / "work", token="t")

    def made(options):
        return context.make_context(tmp_path / "out", options, secret="s", work=work, device="cpu")

    assert made(config.GradeOptions()).settings.yardstick_cache == tmp_path / "cache" / "grader" / "yardstick"
    assert made(config.GradeOptions(yardstick_cache=tmp_path / "serve")).settings.yardstick_cache == tmp_path / "serve"


def test_the_reference_kernels_configs_are_recorded_beside_the_students_in_the_details():
    from grader.grading.exercise_run import timer_process
    from tests.plans import toy_plan

    student, reference = toy_plan(), toy_plan()
    assert credit_messages.launch_configs(student) == ["_toy_kernel: BLOCK=1024, num_warps=4"]
    bench = PART.benchmarks[0].label
    measurement = _measurement(0.09)
    measurement.plans = {bench: student}
    entry = timer_process.PartTiming(PART.name, measurement, 5.0, yardstick={bench: reference})
    timer_process._jobs("gelu", [entry], complete=False)  # what the grader knows of the reference, per benchmark
    assert measurement.reference_configs == {bench: ["_toy_kernel: BLOCK=1024, num_warps=4"]}
    (row, *others) = _judge(measurement).rows
    assert row.configs == row.reference_configs == ["_toy_kernel: BLOCK=1024, num_warps=4"]
    assert all(r.reference_configs is None and r.configs is None for r in others)  # not recorded for those


def test_a_constexpr_the_launch_passed_is_kept_in_the_plan():
    from tests.plans import toy_plan

    again = LaunchPlan.from_dict(toy_plan().to_dict())
    assert again.steps[0].args[3].value == 1024
