"""Speed that cannot be forged, on a CPU: the GPU is held before every timed call (device time, never the
launch path), the timing primitives are captured before student code runs and any replacement is named,
times beyond the GPU's physical limits and baselines far from their calibration are caught in the grader's
process, and the judge turns them into a flag (no speed credit) or a regrade (never a silent 0)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch
import triton.testing

from grader import exercises
from grader.grading.exercise_run import item_plan
from grader.grading.exercise_run.judging import ExerciseJudge
from grader.grading.isolation import protocol, wire
from grader.grading.results.scoring import score_part
from grader.speed import (
    bench,
    clocks,
    credit,
    credit_messages,
    gpu_limits,
    primitives,
    stats,
    student_calls,
    tamper,
    timing,
    trust_checks,
)
from grader.speed.measure import STUDENT, BenchmarkTiming, SpeedMeasurement
from grader.speed.thresholds.calibrated import Threshold, Thresholds
from tests.fake_clock import FakeClock

H100 = "NVIDIA H100 80GB HBM3"
GELU = exercises.get("gelu")
PART = GELU.parts[0]
FP32 = PART.benchmarks[0]  # fp32-4096x8192: 256 MiB moved, ~0.09 ms at 3 TB/s


def _stats(ms: float) -> stats.Stats:
    return stats.Stats(20, ms, ms, 0.0, ms, ms, ms, ms)


def _measurement(student_ms: float, baseline_ms: float, *, tampered=(), gpu=H100) -> SpeedMeasurement:
    rows = [BenchmarkTiming(b.label, {STUDENT: _stats(student_ms), "torch": _stats(baseline_ms)}, "events",
                            "converged", 20) for b in PART.benchmarks]
    return SpeedMeasurement(gpu, rows, recheck=None, tampered=list(tampered))


def _thresholds(baseline_ms: float = 0.0937) -> Thresholds:
    entries = {("gelu", "forward", b.label): Threshold("torch", 0.0936, baseline_ms, 0.9, 0.5)
               for b in PART.benchmarks}
    return Thresholds(H100, entries, copy_gbps=3000.0, matmul_tflops={"bfloat16": 700.0})


def test_the_gpu_is_held_longer_than_each_candidate_takes_to_launch():
    clock = FakeClock()

    def candidate(ms):
        def fn(inputs):
            clock.advance(ms)  # FakeClock: host time is device time, so launching takes `ms`
            return inputs["x"]
        return fn

    candidates = [timing.Candidate("slow_launch", candidate(2.0)), timing.Candidate("quick", candidate(0.1))]
    result = timing.measure(candidates, [{"x": torch.zeros(3)}], clock=clock, rule=stats.StopRule(min_rounds=3),
                            warmup_ms=0, graph_below_ms=None)
    timed_holds = clock.holds[-2 * result.rounds:]
    slow, quick = 2.0 * timing.HOLD_FACTOR + timing.HOLD_MIN_MS, 0.1 * timing.HOLD_FACTOR + timing.HOLD_MIN_MS
    assert sorted(set(timed_holds)) == pytest.approx([quick, slow])
    # the warm-up's three calls that estimate each candidate's time: the first held the longest, the others as
    # the rounds will be (a turn alone waits for every millisecond held)
    assert clock.holds[:6] == pytest.approx([timing.HOLD_MAX_MS, slow, slow, timing.HOLD_MAX_MS, quick, quick])
    assert result.warmup_s > 0 and result.timed_s > 0


def test_a_call_that_takes_longer_to_launch_than_any_hold_is_noted():
    clock = FakeClock()

    def slow(inputs):
        clock.advance(timing.HOLD_MAX_MS * 2)
        return inputs["x"]

    result = timing.measure([timing.Candidate("syncs", slow)], [{"x": torch.zeros(3)}], clock=clock,
                            rule=stats.StopRule(min_rounds=3), warmup_ms=0, graph_below_ms=None)
    assert any("its time includes the gaps while it launches" in n for n in result.notes)


@pytest.fixture
def captured():
    tamper.capture_primitives()
    yield
    primitives.CAPTURED.clear()


def test_replaced_timing_primitives_are_named(captured, monkeypatch):
    assert tamper.tampered() == []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, end: 1e-6)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(triton.testing, "do_bench", lambda *a, **k: 1e-6)
    assert set(tamper.tampered()) >= {"time.perf_counter", "torch.cuda.Event.elapsed_time",
                                      "torch.cuda.synchronize", "triton.testing.do_bench"}
    monkeypatch.undo()
    assert tamper.tampered() == []


def test_rewritten_code_of_the_graders_own_timing_is_named(captured, monkeypatch):
    monkeypatch.setattr(stats.summarize, "__code__", (lambda samples: None).__code__)
    monkeypatch.setattr(clocks.CudaClock.elapsed_ms, "__code__", (lambda self, a, b: 1e-6).__code__)
    assert {"grader.speed.stats.summarize", "grader.speed.clocks.CudaClock.elapsed_ms"} <= set(tamper.tampered())


def test_the_timer_patching_fixture_is_caught_at_import(captured):
    path = Path(__file__).parents[1] / "cheating" / "gelu" / "timer_patch" / "gelu" / "gelu.py"
    saved = (torch.cuda.Event.elapsed_time, torch.cuda.synchronize, triton.testing.do_bench, time.perf_counter)
    try:
        spec = importlib.util.spec_from_file_location("_timer_patch_fixture", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        assert set(tamper.tampered()) >= {"time.perf_counter", "torch.cuda.Event.elapsed_time",
                                          "torch.cuda.synchronize", "triton.testing.do_bench"}
    finally:
        (torch.cuda.Event.elapsed_time, torch.cuda.synchronize, triton.testing.do_bench, time.perf_counter) = saved


def test_the_workers_speed_reply_names_what_the_recording_replaced(captured, monkeypatch):
    """The worker asks after the recording (the student's calls) what was replaced: its reply carries the names,
    which the judge turns into the flag."""
    from grader.grading.isolation import worker

    def record_part(part, module, *, recheck_inputs):  # the student's call replaces the clock while it runs
        monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
        return SpeedMeasurement("fake GPU")

    monkeypatch.setattr(student_calls, "tune_part", lambda part, module: None)
    monkeypatch.setattr(student_calls, "record_part", record_part)
    reply = worker._run(protocol.RunSpeed("r1", "forward", 1.0, None), GELU, {"forward": None}, "cpu")
    assert isinstance(reply, protocol.SpeedDone)
    assert "time.perf_counter" in reply.measurement.tampered


def test_physical_limits():
    h100 = gpu_limits.for_gpu(H100, None)
    assert h100.source == "datasheet" and h100.bandwidth_gbps == 3350.0
    floor = gpu_limits.floor_ms(h100, 2 * 4096 * 8192 * 4, None, "float32")
    assert floor == pytest.approx(268435456 / 3350e9 * 1e3)
    assert not gpu_limits.impossible(0.0937, floor)  # the reference: about 2.9 TB/s
    assert gpu_limits.impossible(1e-6, floor)
    unknown = gpu_limits.for_gpu("NVIDIA Z9000", None)
    assert unknown is None  # nothing known: nothing checked
    measured = gpu_limits.for_gpu("NVIDIA Z9000", Thresholds("NVIDIA Z9000", {}, copy_gbps=1000.0))
    assert measured.source == "calibration" and measured.bandwidth_gbps == pytest.approx(1250.0)


def test_impossible_times_are_found_for_the_student_and_the_baselines():
    assert trust_checks.impossible_times(PART, _measurement(0.094, 0.0937), None) == []
    found = trust_checks.impossible_times(PART, _measurement(1e-6, 1e-6), None)
    assert len(found) == 2 * len(PART.benchmarks)
    assert "your kernel measured 0.0 µs, but the work needs at least" in found[0]
    assert any("the baseline 'torch'" in f for f in found)


def test_a_baseline_far_from_its_calibration_is_drift():
    part_credit = credit.part_credit(PART, _measurement(0.094, 0.3), recheck=credit.Verdict(True),
                                     thresholds=_thresholds())
    drift = trust_checks.baseline_drift(part_credit.rows, _thresholds(), PART)
    assert drift and "3.20× its calibrated" in drift
    fair = credit.part_credit(PART, _measurement(0.094, 0.0937), recheck=credit.Verdict(True),
                              thresholds=_thresholds())
    assert trust_checks.baseline_drift(fair.rows, _thresholds(), PART) is None


def _judge_speed(measurement, monkeypatch, thresholds) -> tuple[ExerciseJudge, object]:
    monkeypatch.setattr(credit, "load_thresholds", lambda gpu=None: thresholds)
    item = next(it for it in item_plan.plan(GELU, device="cuda", secret="s", random_cases=0, speed_budget_s=1.0)
                if it.role == "speed")
    judge = ExerciseJudge(GELU, device="cuda", student_dir="/nowhere")
    request = protocol.RunSpeed(item.id, PART.name, 1.0, None)
    judge.on_reply(item, request, protocol.SpeedDone(item.id, measurement))
    return judge, judge.parts[PART.name]


def _graded_part(state):
    from grader.grading.results.results import PartResult

    return PartResult(PART.name, "graded", flags=list(state.flags.values()), speed=state.speed)


def test_the_judge_flags_replaced_timers_and_impossible_times_without_zeroing_correctness(monkeypatch):
    from grader.grading import config

    _, state = _judge_speed(_measurement(1e-6, 1e-6, tampered=["time.perf_counter"]), monkeypatch, _thresholds())
    assert state.errors == [] and state.speed.status == "flagged" and state.speed.fraction == 0.0
    assert {f["rule"] for f in state.flags.values()} == {"timer-tampering", "impossible-speed"}
    assert all(f["scope"] == "speed" for f in state.flags.values())
    lines = score_part(GELU, PART, _graded_part(state), 1.0, config.load_course())
    speed_line = next(ln for ln in lines if ln.component == "speed")
    assert speed_line.score == 0 and "[timer-tampering]" in speed_line.output
    assert "[impossible-speed]" in speed_line.output


def test_an_uncalibrated_gpu_or_a_drifting_baseline_waits_for_a_regrade(monkeypatch):
    from grader.grading import config

    _, state = _judge_speed(_measurement(0.094, 0.0937, gpu="NVIDIA Z9000"), monkeypatch, None)
    assert state.speed.status == "needs regrade" and "no calibrated thresholds" in state.speed.message
    lines = score_part(GELU, PART, _graded_part(state), 1.0, config.load_course())
    # correctness is scored (it failed here: this part has no checks), speed is pending
    assert [ln.status for ln in lines] == ["failed", "needs regrade"]
    _, state = _judge_speed(_measurement(0.094, 0.3), monkeypatch, _thresholds())
    assert state.speed.status == "needs regrade" and "not running as it was calibrated" in state.speed.message
    _, state = _judge_speed(_measurement(0.094, 0.0937), monkeypatch, _thresholds())
    assert state.speed.status == "measured" and state.speed.fraction == 1.0 and state.flags == {}


def test_pytest_and_bench_apply_the_graders_trust_checks():
    """``pytest -m speed`` and ``grader bench`` judge through credit.judge too: an impossible time earns no credit
    there either (each asks without requiring calibration, as they always scored)."""
    impossible = _measurement(1e-6, 1e-6)
    for labels in (None, [FP32.label]):  # grader bench: the part; pytest: one benchmark
        verdict = credit.judge(PART, impossible, recheck=credit.Verdict(True), thresholds=None, labels=labels,
                               require_calibration=False)
        assert verdict.status == credit.FLAGGED and verdict.fraction == 0.0
        assert [rule for rule, _ in verdict.flags] == ["impossible-speed"]
    honest = credit.judge(PART, _measurement(0.094, 0.0937), recheck=credit.Verdict(True), thresholds=None,
                          labels=[FP32.label], require_calibration=False)
    assert honest.status == credit.MEASURED and [r.label for r in honest.rows] == [FP32.label]
    result = {"gpu": H100, "roofline": {"copy_gbps": 3000.0}, "baseline": "torch", "rows": impossible.benchmarks}
    rows = bench.table_rows(result, PART, None)
    yours = [r for r in rows if r["impl"] == "yours"]
    assert yours and all(r["credit"] is None and "cannot be trusted" in r["flag"] for r in yours)


def test_a_speed_measurement_travels_from_the_worker_to_the_judge(monkeypatch):
    """The speed item's whole data path on a CPU: the worker's recorded plan and recheck, the wire form through
    torch.save, the timer's rows (a fake clock stands in for CUDA events), and the grader's judge with calibrated
    thresholds."""
    import io

    from grader.checks.execute import execute
    from grader.checks.spec import Benchmark, Case, Exercise, Part, Tolerances
    from grader.speed import measure
    from tests.plans import toy_plan

    clock = FakeClock()
    case = Case({"n": 1024, "dtype": "float32"})

    def make_inputs(c):
        return {"x": torch.randn(c["n"], generator=torch.Generator().manual_seed(c.seed))}

    def timed(ms, fn):
        def run(inputs):
            clock.advance(ms)
            return fn(inputs)
        return run

    part = Part(name="forward", functions=("double",), make_inputs=make_inputs,
                call=lambda module, inputs: {"y": module.double(inputs["x"])},
                reference=lambda inputs: {"y": inputs["x"].double() * 2},
                cases=lambda device: None, examples=(case,), tolerances=Tolerances((torch.float32, 1e-6, 1e-6)),
                benchmarks=(Benchmark("n1024", case, bytes_moved=lambda i: 8.0 * i["x"].numel()),),
                baselines={"torch": timed(1.0, lambda i: {"y": i["x"] * 2})}, speed_baseline="torch",
                speed_points=5)
    toy = Exercise("toy", "toy", "Toy", (part,))
    module = type("Module", (), {"double": staticmethod(lambda x: (clock.advance(0.5), x * 2)[1])})
    item = next(it for it in item_plan.plan(toy, device="cuda", secret="s", random_cases=0, speed_budget_s=1.0)
                if it.role == "speed")
    # what the worker sends: the recorded plan and the call on the secret fresh inputs
    recheck = execute(part, module, item.part.make_inputs(item.recheck), "cpu")
    recorded = SpeedMeasurement(H100, [BenchmarkTiming("n1024", warmup_s=0.5)], recheck=recheck,
                                plans={"n1024": toy_plan()})
    buf = io.BytesIO()
    torch.save(wire.encode(protocol.SpeedDone(item.id, recorded)), buf)
    buf.seek(0)
    reply = wire.decode(torch.load(buf, weights_only=True))
    assert reply.measurement.plans == recorded.plans and reply.measurement.tampered == []
    assert torch.equal(reply.measurement.recheck.outputs["y"], recorded.recheck.outputs["y"])
    # what the trusted timer makes of it: the timing engine's row for the replayed call
    row = measure.measure_benchmark(part, student_calls.student_call(part, module), part.benchmarks[0], device="cpu",
                                   clock=clock, budget_s=1.0)
    reply.measurement.benchmarks = [row]
    thresholds = Thresholds(H100, {("toy", "forward", "n1024"): Threshold("torch", 0.5, 1.0, 1.5, 1.0)})
    monkeypatch.setattr(credit, "load_thresholds", lambda gpu=None: thresholds)
    judge = ExerciseJudge(toy, device="cpu", student_dir="/nowhere")  # the outputs are on the CPU here
    judge.on_reply(item, protocol.RunSpeed(item.id, "forward", 1.0, item.part.make_inputs(item.recheck)), reply)
    state = judge.parts["forward"]
    assert state.errors == [] and state.flags == {}
    assert state.speed.status == "measured" and state.speed.fraction == 1.0
    assert state.speed.rows[0].ratio == pytest.approx(2.0)
    assert judge.profile["speed: timed rounds"] > 0


def test_a_slow_parts_report_names_the_kernels_its_call_launched():
    """The worker's recorded plan says what one call launched: a part below full speed is told, kernel by kernel
    (names cleaned: they come from the student's process); a fast one, and pytest's rows (no plan), are not."""
    from dataclasses import replace

    from tests.plans import toy_plan

    plan = toy_plan()
    plan.steps = [plan.steps[0]] * 3  # the same kernel three times over the tensor
    plan.kernels = [replace(plan.kernels[0], name="_toy<b>kernel")]
    slow = _measurement(0.3, 0.0937)
    slow.plans = {b.label: plan for b in PART.benchmarks}
    scored = credit.part_credit(PART, slow, recheck=credit.Verdict(True), thresholds=_thresholds())
    assert scored.fraction < 1 and all(r.launches == ["_toybkernel"] * 3 for r in scored.rows)
    assert "your call launches 3 kernels (_toybkernel ×3), the reference solution's 1:" in scored.message
    assert "<b>" not in scored.message
    assert scored.rows[0].to_dict()["launches"] == ["_toybkernel"] * 3
    assert scored.rows[0].to_dict()["reference_launches"] == PART.reference_launches == 1
    fast = _measurement(0.094, 0.0937)
    fast.plans = slow.plans
    assert "your call launches" not in credit.part_credit(PART, fast, recheck=credit.Verdict(True),
                                                          thresholds=_thresholds()).message
    unrecorded = credit.part_credit(PART, _measurement(0.3, 0.0937), recheck=credit.Verdict(True),
                                    thresholds=_thresholds())
    assert unrecorded.rows[0].launches is None and "launches" not in unrecorded.rows[0].to_dict()
    assert "reference_launches" not in unrecorded.rows[0].to_dict()
    assert credit_messages.launch_list(["a", "b", "a"]) == "3 kernels (a ×2, b)"


@pytest.mark.parametrize("behaviour", ["computes", "replays", "wrong"],
                         ids=["computes every call", "replays its first result", "merely wrong on fresh inputs"])
def test_the_recheck_is_judged_when_the_recording_comes_not_after_the_timing(monkeypatch, behaviour):
    """The speed measurement's call on fresh inputs (the recheck) is judged as soon as the worker's recording comes,
    while the trusted timer prepares: its float64 reference is computed then, once, and the timed measurement's
    verdict uses it. A kernel that returns the recorded call's output again on the fresh inputs is flagged; one whose
    output is merely wrong earns no speed credit, and no flag: a wrong result is no evidence of a cached one."""
    cached = behaviour != "computes"
    from grader.checks.execute import execute
    from grader.checks.spec import Benchmark, Case, Exercise, Part, Tolerances
    from tests.plans import toy_plan

    case = Case({"n": 256, "dtype": "float32"})
    computed: list[int] = []

    def reference(inputs):
        computed.append(inputs["x"].numel())
        return {"y": inputs["x"].double() * 2}

    part = Part(name="forward", functions=("double",),
                make_inputs=lambda c: {"x": torch.randn(c["n"], generator=torch.Generator().manual_seed(c.seed))},
                call=lambda module, inputs: {"y": module.double(inputs["x"])}, reference=reference,
                cases=lambda device: None, examples=(case,), tolerances=Tolerances((torch.float32, 1e-6, 1e-6)),
                benchmarks=(Benchmark("n256", case, bytes_moved=lambda i: 8.0 * i["x"].numel()),),
                baselines={"torch": lambda i: {"y": i["x"] * 2}}, speed_baseline="torch", speed_points=5)
    toy = Exercise("toy", "toy", "Toy", (part,))
    item = next(it for it in item_plan.plan(toy, device="cuda", secret="s", random_cases=0, speed_budget_s=1.0)
                if it.role == "speed")
    first = part.make_inputs(case)["x"] * 2
    module = type("Module", (), {"double": staticmethod(lambda x: first if cached else x * 2)})
    request = protocol.RunSpeed(item.id, "forward", 1.0, part.make_inputs(item.recheck))
    recheck = execute(part, module, request.recheck_inputs, "cpu")
    recorded = SpeedMeasurement(H100, [BenchmarkTiming("n256", warmup_s=0.5)], recheck=recheck,
                                plans={"n256": toy_plan()}, recheck_repeats=behaviour == "replays")
    judge = ExerciseJudge(toy, device="cpu", student_dir="/nowhere")
    judge.on_recorded(item, request, protocol.SpeedDone(item.id, recorded))
    assert computed == [256], "the recheck's reference was not computed when the recording came"
    assert judge.profile["speed: judging the recheck, before the timing"] >= 0
    # the trusted timer's row, then the timed measurement judged
    recorded.benchmarks = [BenchmarkTiming("n256", {STUDENT: _stats(0.1), "torch": _stats(0.1)}, "events",
                                           "converged", 20)]
    thresholds = Thresholds(H100, {("toy", "forward", "n256"): Threshold("torch", 0.1, 0.1, 0.9, 0.5)})
    monkeypatch.setattr(credit, "load_thresholds", lambda gpu=None: thresholds)
    judge.on_reply(item, request, protocol.SpeedDone(item.id, recorded))
    state = judge.parts["forward"]
    assert computed == [256], "the recheck was judged again after the timing"
    assert state.errors == []
    if behaviour == "replays":
        assert "speed-recheck" in state.flags and "bit for bit the output of the recorded call" in str(state.flags)
    if cached:
        assert "on fresh inputs after the timed runs" in state.speed.message and state.speed.fraction == 0.0
    if behaviour == "wrong":
        assert state.flags == {} and "a wrong result earns no speed credit" in state.speed.message
    if not cached:
        assert state.flags == {} and state.speed.status == "measured" and state.speed.fraction == 1.0


def test_a_repeated_output_is_told_apart_from_a_merely_wrong_one():
    """The evidence behind the `speed-recheck` flag: the recheck's outputs bit for bit the recorded call's."""
    from grader.speed.student_calls import same_outputs

    recorded = {"o": torch.arange(6.0).reshape(2, 3), "lse": torch.ones(2)}
    assert same_outputs({"o": recorded["o"].clone(), "lse": recorded["lse"].clone()}, recorded)
    assert same_outputs({"o": recorded["o"].t().contiguous().t(), "lse": recorded["lse"]}, recorded)  # any layout
    assert not same_outputs({"o": recorded["o"] + 1e-6, "lse": recorded["lse"]}, recorded)  # other values
    assert not same_outputs({"o": recorded["o"], "lse": recorded["lse"].bfloat16()}, recorded)  # a wrong dtype
    assert not same_outputs({"o": recorded["o"]}, recorded)
    assert not same_outputs(None, recorded)
