"""Speed grading on a CPU: measuring with a fake clock (cached results caught, errors named), credit
(ratios, messages, uncalibrated GPUs, the post-timing recheck), the pytest speed tests (skipped on CPU,
fed the graded samples), the slowed fixtures' correctness, and grader bench's table, rounds, options and
roofline chart."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import strategies as st

from grader import exercises
from grader.checks import catalog, loader, tensors, verdicts
from grader.checks.runtime import configure
from grader.checks.spec import Benchmark, Case, Exercise, Part, Tolerances
from grader.grading.commands import calibrate
from grader.pytest_plugin import spec_tests, speed_tests
from grader.speed import bench, credit, measure, student_calls, workload
from grader.speed.thresholds import gpu_files, speed_curves
from grader.speed.thresholds.calibrated import Threshold, Thresholds
from grader.speed.timing import StopRule
from tests.fake_clock import FakeClock

from .. import known_wrong

ROOT = Path(__file__).resolve().parents[2]
ROOF = {"copy_gbps": 20.0, "matmul_tflops": {"float32": 0.002}}
GPU = "NVIDIA H100 80GB HBM3"


def _toy_part(clock: FakeClock, *, torch_ms: float = 1.0, flops: bool = False, speed_points: float = 5) -> Part:
    """y = 2x over n elements; the baselines advance the fake clock."""
    case = Case({"n": 1024, "dtype": "float32"})

    def make_inputs(case: Case) -> dict:
        return {"x": torch.randn(case["n"], generator=tensors.generator(case.seed))}

    def baseline(ms):
        def run(inputs):
            clock.advance(ms)
            return inputs["x"] * 2

        return run

    part = Part(
        name="forward", functions=("double",), make_inputs=make_inputs,
        call=lambda module, inputs: {"y": module.double(inputs["x"])},
        reference=lambda inputs: {"y": inputs["x"].double() * 2},
        cases=lambda device: st.just(case), examples=(case,), tolerances=Tolerances((torch.float32, 1e-6, 1e-6)),
        benchmarks=(Benchmark("n1024", case, bytes_moved=lambda i: 8.0 * i["x"].numel(),
                              flops=(lambda i: 1e6 * i["x"].numel()) if flops else None),),
        baselines={"torch": baseline(torch_ms), "copy": baseline(0.8), "extra": baseline(5.0)},
        speed_baseline="torch", speed_points=speed_points,
    )
    Exercise("toy", "toy", "Toy", (part,))  # a part knows its exercise
    return part


def _module(clock: FakeClock, ms: float, compute=lambda x: x * 2):
    def double(x):
        clock.advance(ms)
        return compute(x)

    return SimpleNamespace(double=double)


def _measure(part, module, clock, **kw):
    return measure.measure_benchmark(part, student_calls.student_call(part, module), part.benchmarks[0], device="cpu",
                                     clock=clock,
                                     rule=StopRule(min_rounds=5), warmup_ms=0, graph_below_ms=None, **kw)


def _calibrated(full=0.85, partial=0.5) -> Thresholds:
    return Thresholds(GPU, {("toy", "forward", "n1024"): Threshold("torch", 0.9, 1.0, full, partial)},
                      Path("grader/speed/thresholds/h100.toml"))


def _score(part, row, thresholds):
    bench = part.benchmarks[0]
    threshold, source = credit.resolve_threshold(part, bench.label, thresholds)
    scored = credit.benchmark_credit(row, bench.label, workload.benchmark_work(part, bench), threshold, source, ROOF)
    return credit.summarize([scored], ROOF, GPU, thresholds, verdicts.Verdict(True))


def test_measure_times_the_student_against_the_grading_baselines():
    clock = FakeClock()
    part = _toy_part(clock)
    samples: list[float] = []
    row = _measure(part, _module(clock, 0.5), clock, samples=samples)
    assert row.error is None and row.stop == "converged"
    assert set(row.times) == {"student", "torch", "copy"}  # "extra" is for grader bench only
    assert row.median("student") == pytest.approx(0.5) and row.median("torch") == pytest.approx(1.0)
    assert samples == pytest.approx([0.5] * row.rounds)
    assert measure.BenchmarkTiming.from_dict(row.to_dict()) == row
    work = workload.benchmark_work(part, part.benchmarks[0])
    assert work.bytes == 8192.0 and work.flops is None
    with pytest.raises(ValueError, match="declares no baseline nope"):
        _measure(part, _module(clock, 0.5), clock, baselines=["nope"])


def test_benchmark_work_is_counted_on_inputs_without_values(monkeypatch):
    """Every shipped benchmark's bytes and FLOPs come from meta-device inputs (no CPU draw, which takes seconds per
    benchmark), and equal the counts on the inputs drawn for real."""
    drawn = []
    monkeypatch.setattr(workload, "cpu_inputs", lambda part, case: drawn.append(part.name))
    monkeypatch.setattr(workload, "_WORK", {})
    counted = {(ex.name, part.name, b.label): workload.benchmark_work(part, b)
               for ex in exercises.all_exercises() for part in ex.parts for b in part.benchmarks}
    assert drawn == [] and len(counted) >= 10
    for ex in exercises.all_exercises():  # one benchmark per part drawn for real (seconds each)
        for part in ex.parts:
            if part.benchmarks:
                bench_ = part.benchmarks[0]
                real = workload._work(bench_, part.make_inputs(bench_.case))
                assert counted[(ex.name, part.name, bench_.label)] == real, (ex.name, part.name, bench_.label)


def test_benchmark_work_whose_inputs_read_values_is_counted_on_drawn_inputs(monkeypatch):
    def make_inputs(case: Case) -> dict:  # reads a value: impossible without values
        x = tensors.values((case["n"],), "normal", tensors.generator(case.seed))
        return {"x": (x / float(x.abs().max())).float()}

    part = dataclasses.replace(_toy_part(FakeClock()), make_inputs=make_inputs)
    monkeypatch.setattr(workload, "_WORK", {})
    assert workload.benchmark_work(part, part.benchmarks[0]).bytes == 8192.0


def test_fast_enough_gets_full_credit_with_numbers():
    clock = FakeClock()
    part = _toy_part(clock)
    score = _score(part, _measure(part, _module(clock, 0.5), clock), _calibrated())
    (r,) = score.rows
    assert score.fraction == 1.0 and score.calibrated and r.threshold == "calibrated"
    assert (r.ratio, r.student_ms, r.baseline_ms, r.copy_ms) == pytest.approx((2.0, 0.5, 1.0, 0.8))
    assert r.gbps == pytest.approx(8192 / 0.5e-3 / 1e9)
    assert r.pct_roofline == pytest.approx(100 * (8192 / 20e9) / 0.5e-3)
    assert r.bound == "memory" and r.reference_ms == 0.9
    assert "speed: 100% (1 of 1 benchmark at full speed)" in score.message
    assert "thresholds: grader/speed/thresholds/h100.toml" in score.message


def test_too_slow_says_measured_required_ratio_bandwidth_and_causes():
    clock = FakeClock()
    part = _toy_part(clock)
    score = _score(part, _measure(part, _module(clock, 1.6), clock), _calibrated(full=0.85, partial=0.5))
    (r,) = score.rows
    assert r.ratio == pytest.approx(0.625)
    assert score.fraction == pytest.approx((0.625 - 0.5) / 0.35)
    message = score.message
    assert "n1024: 1.600 ms = 0.62× the speed of torch (1.000 ms)" in message
    assert "required: 0.85× torch (≤ 1.176 ms) for full credit" in message
    assert "GB/s = 0% of the copy bandwidth (20 GB/s measured)" in message
    assert "a plain copy of the same data takes 0.800 ms" in message
    assert "memory-bound" in message and "BLOCK too small" in message and "uncoalesced loads" in message


def test_compute_bound_hints():
    clock = FakeClock()
    part = _toy_part(clock, flops=True)
    score = _score(part, _measure(part, _module(clock, 4.0), clock), _calibrated())
    assert score.rows[0].bound == "compute" and score.fraction == 0.0
    assert "TFLOP/s" in score.message and "materialized intermediates" in score.message


def test_a_cached_result_is_not_timed():
    clock = FakeClock()
    part = _toy_part(clock)
    cache = {}

    def cached(x):  # computes once per shape, then replays
        clock.advance(0.01)
        return cache.setdefault(tuple(x.shape), x * 2)

    row = _measure(part, _module(clock, 0, compute=cached), clock)
    assert "same result for two different inputs" in row.error
    score = _score(part, row, _calibrated())
    assert score.fraction == 0.0 and "cached" in score.message


def test_a_stale_result_in_a_timed_run_is_caught():
    clock = FakeClock()
    part = _toy_part(clock)
    previous = []

    def one_behind(x):  # right during warm-up (each input set once), then returns the previous call's result
        result = x * 2
        previous.append(result)
        return result if len(previous) <= 2 else previous[-2]

    row = _measure(part, _module(clock, 0.1, compute=one_behind), clock)
    assert "in a timed run differs from its result for the same input" in row.error


def test_errors_are_named():
    clock = FakeClock()
    part = _toy_part(clock)

    def boom(x):
        raise RuntimeError("out of resources")

    row = _measure(part, _module(clock, 0.1, compute=boom), clock)
    assert row.error.startswith("double raised RuntimeError: out of resources")

    def todo(x):
        raise NotImplementedError("write me")

    row = _measure(part, _module(clock, 0.1, compute=todo), clock)
    assert row.not_implemented and "not implemented yet" in row.error

    row = _measure(part, _module(clock, 0.1, compute=lambda x: [x]), clock)
    assert "double returned {y: list}, expected tensors" in row.error


def test_uncalibrated_gpu_uses_the_calibrated_gpus_ratios(monkeypatch):
    clock = FakeClock()
    part = _toy_part(clock)
    row = _measure(part, _module(clock, 1.6), clock)
    lenient = {("toy", "forward", "n1024"): Threshold("torch", 1, 1, 0.6, 0.3)}
    monkeypatch.setattr(gpu_files, "portable", lambda: (lenient, ["h100", "h200"]))
    score = _score(part, row, None)
    assert not score.calibrated and score.rows[0].threshold == "portable" and score.fraction == 1.0
    assert f"this GPU ({GPU}) is not calibrated" in score.message
    assert "the most lenient ratios of the calibrated GPUs (h100, h200)" in score.message
    monkeypatch.setattr(gpu_files, "portable", lambda: ({}, []))
    score = _score(part, row, None)
    assert score.rows[0].threshold == "default" and score.rows[0].required_full == 0.5
    assert "default ratios" in score.message and "grader calibrate" in score.message
    # a file for this GPU without an entry for the benchmark, or for another baseline
    score = _score(part, row, Thresholds(GPU, {("toy", "forward", "n1024"): Threshold("sdpa", 1, 1, 0.9, 0.5)}))
    assert not score.calibrated and "has no entry for some benchmarks" in score.message


def _measurement(part, module, clock):
    return measure.SpeedMeasurement(GPU, [_measure(part, module, clock)])


def test_part_credit_takes_the_recheck_verdict():
    clock = FakeClock()
    part = _toy_part(clock)
    measurement = _measurement(part, _module(clock, 0.5), clock)
    good = credit.part_credit(part, measurement, recheck=verdicts.Verdict(True), thresholds=_calibrated(),
                              roofline=ROOF)
    assert good.fraction == 1.0 and good.calibrated
    bad = credit.part_credit(part, measurement, recheck=verdicts.Verdict(False, "on fresh inputs, double is wrong"),
                             thresholds=_calibrated(), roofline=ROOF)
    assert bad.fraction == 0.0 and bad.rows[0].credit == 0.0
    assert "speed: no credit — on fresh inputs, double is wrong" in bad.message


def test_part_credit_counts_unmeasured_benchmarks_as_zero():
    clock = FakeClock()
    part = _toy_part(clock)
    score = credit.part_credit(part, measure.SpeedMeasurement(GPU), recheck=verdicts.Verdict(True),
                               thresholds=_calibrated())
    assert score.fraction == 0.0 and score.rows[0].error == "not measured"
    assert score.to_dict()["rows"][0]["label"] == "n1024"


def test_no_thresholds_without_a_gpu():
    assert credit.load_thresholds() is None  # no GPU here: not calibrated


def test_speed_tests_exist_for_speed_graded_parts_only():
    clock = FakeClock()
    gelu = exercises.get("gelu")
    tests = spec_tests.exercise_tests("gelu")
    assert "test_forward_speed" in tests
    marks = {m.name: m for m in tests["test_forward_speed"].pytestmark}
    assert {"speed", "benchmark", "parametrize", "grader_check"} <= set(marks)
    assert marks["parametrize"].args[1] == gelu.parts[0].benchmarks
    assert catalog.SPEED not in catalog.kinds(_toy_part(clock, speed_points=0))


def test_pytest_benchmark_gets_the_graded_samples():
    """pytest-benchmark's pedantic mode, on an empty target, records exactly the samples it is handed."""
    timer = speed_tests.SampleReplayTimer()
    timer.load([0.5, 0.25, 1.0])
    readings = [timer() for _ in range(6)]
    assert [b - a for a, b in zip(readings[::2], readings[1::2])] == pytest.approx([0.5e-3, 0.25e-3, 1e-3])


def test_speed_tests_are_skipped_on_cpu_with_the_reason():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "assignments/gelu", "assignments/softmax", "--impl", "solutions",
         "-m", "speed", "-rs", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 skipped" in proc.stdout
    assert "speed tests need a CUDA GPU: kernels are running in the Triton interpreter" in proc.stdout


def test_every_speed_spec_is_consistent():
    for exercise in exercises.all_exercises():
        for part in exercise.parts:
            if not part.benchmarks:
                continue
            where = f"{exercise.name}.{part.name}"
            labels = [b.label for b in part.benchmarks]
            assert len(set(labels)) == len(labels), f"{where}: duplicate benchmark labels"
            assert part.speed_baseline in part.baselines, f"{where}: speed_baseline is not a baseline"
            assert all(callable(f) for f in part.baselines.values()), where


# --- the slowed fixtures: correct, so that they lose only speed credit -------------------------

SLOWED = known_wrong.slowed()


def test_slow_fixtures_exist():
    assert {f.id for f in SLOWED} >= {"gelu/block32", "softmax/three_passes", "flash_attention/tiles_16x16"}


@pytest.mark.parametrize("fixture", SLOWED, ids=[f.id for f in SLOWED])
def test_slow_fixture_is_correct(fixture: known_wrong.Fixture):
    assert fixture.slower, f"{fixture.id}: its doc declares no 'slower: <part>' line"
    exercise = exercises.get(fixture.exercise)
    device = configure().device
    root = known_wrong.tree_or_fail(fixture)
    for part in map(exercise.part, fixture.slower):
        assert part.benchmarks, f"{fixture.id}: {part.name} has no benchmarks to be slower on"
        module = loader.load(root, exercise, part.functions)
        for case in part.examples:
            if part.skip(case, device) is None:
                verdict = verdicts.run_case(part, module, case, device)
                assert verdict.passed, f"{fixture.id} must be correct: {verdict.message}"
        case = next(c for c in part.integrity_examples if part.skip(c, device) is None)
        verdict = verdicts.run_integrity(part, module, case, device,
                                         student_dir=str(loader.module_path(root, exercise).parent))
        assert verdict.passed, verdict.message


# --- grader bench and grader calibrate ----------------------------------------------------------


def _bench_result():
    clock = FakeClock()
    part = _toy_part(clock)
    row = _measure(part, _module(clock, 1.5), clock, baselines=["torch", "copy", "extra"])
    broken = measure.BenchmarkTiming("broken", error="double raised RuntimeError: boom\n  frame")
    return part, {"exercise": "toy", "part": "forward", "gpu": GPU, "roofline": ROOF, "baseline": "torch",
                  "rows": [row, broken]}


def test_bench_table_and_plot(tmp_path, monkeypatch):
    from rich.console import Console

    monkeypatch.setattr(gpu_files, "portable", lambda: ({}, []))
    part, result = _bench_result()
    rows = bench.table_rows(result, part, _calibrated())
    yours = next(r for r in rows if r["impl"] == "yours")
    assert yours["vs_baseline"] == pytest.approx(1 / 1.5) and yours["credit"].credit < 1
    assert {r["impl"] for r in rows} == {"yours", "torch", "copy", "extra"}
    extra = next(r for r in rows if r["impl"] == "extra")
    assert extra["yours_faster"] == pytest.approx(5.0 / 1.5) and yours["yours_faster"] is None
    # a course curve that asks half the baseline's speed: the same kernel (0.67× the baseline) earns full credit
    lenient = bench.table_rows(result, part, _calibrated(), speed_curves.Curve("baseline", 0.5, 0.1))
    assert next(r for r in lenient if r["impl"] == "yours")["credit"].credit == 1.0
    console = Console(record=True, width=220)
    bench.render(result, rows, console)
    text = console.export_text()
    for expected in ("toy · forward on NVIDIA H100", "GB/s", "% roofline", "vs torch", "0.67×", "1.500 ms",
                     "roofline: copy 20 GB/s", "error", "RuntimeError: boom", "yours ×", "3.33×"):
        assert expected in text
    svg = bench.write_plot([(result, rows)], tmp_path / "toy.svg")
    text = svg.read_text()
    assert text.startswith("<svg") and text.count("<svg") == 2  # the stack and one chart
    assert text.count('class="point"') == 4 and "yours" in text  # one per implementation with a number
    page = bench.write_plot([(result, rows), (result, rows)], tmp_path / "toy.html", "CUDA on a GPU")
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") == 2 and "CUDA on a GPU" in html


def test_bench_rounds_report_the_median_of_the_medians():
    clock = FakeClock()
    part = _toy_part(clock)
    rows = [_measure(part, _module(clock, ms), clock) for ms in (0.5, 0.7, 0.6)]
    combined = bench.combine_rounds(rows)
    assert combined.median("student") == pytest.approx(0.6) and combined.times["student"].n == 3
    assert combined.median("torch") == pytest.approx(1.0) and combined.stop == "3 rounds"
    assert combined.rounds == sum(r.rounds for r in rows)
    broken = measure.BenchmarkTiming("n1024", error="boom")
    assert bench.combine_rounds([rows[0], broken]).error == "boom"
    assert bench.combine_rounds(rows[:1]) is rows[0]


def _bench_args(**changes) -> argparse.Namespace:
    values = dict(exercise="gelu", part=None, benchmark=None, plot=None, impl="solutions", baselines=None,
                  budget_s=1.0, rounds=None, leaderboard=False, json=None)
    return argparse.Namespace(**{**values, **changes})


def test_bench_and_calibrate_need_a_gpu(capsys):
    assert bench.run(_bench_args()) == 2
    assert "grader bench: needs a CUDA GPU" in capsys.readouterr().err
    assert bench.run(_bench_args(exercise="flash_attention", leaderboard=True)) == 2  # valid: only the GPU lacks
    assert "grader bench: needs a CUDA GPU" in capsys.readouterr().err
    assert bench.run(_bench_args(exercise="nope")) == 2
    assert "unknown exercise 'nope'" in capsys.readouterr().err
    assert bench.run(_bench_args(leaderboard=True)) == 2
    assert "gelu has no leaderboard case (these do: flash_attention)" in capsys.readouterr().err
    assert bench.run(_bench_args(benchmark=["nope"])) == 2
    assert "forward has no benchmark nope (has: fp32-4096x8192" in capsys.readouterr().err
    assert bench.run(_bench_args(plot="gelu.png")) == 2
    assert "--plot gelu.png: the file must end in .svg or .html" in capsys.readouterr().err
    board = bench.LEADERBOARDS["flash_attention"]
    fa = exercises.get("flash_attention")
    assert [b.label for b in bench._benchmarks(fa.part(board.part), [board.benchmark])] == [board.benchmark]
    assert set(board.baselines) <= set(fa.part(board.part).baselines)
    args = argparse.Namespace(exercises=[], impl="solutions", out=None, repeats=1, budget_s=1.0, full_margin=0.85,
                              partial_margin=0.5, no_recheck=True, json=None)
    assert calibrate.run(args) == 2
    assert "grader calibrate: needs a CUDA GPU" in capsys.readouterr().err
    assert {(e.name, p.name) for e, p in calibrate.speed_parts()} >= {("gelu", "forward"), ("softmax", "forward")}


def test_pytest_header_line_names_the_thresholds(tmp_path, monkeypatch):
    monkeypatch.delenv("GRADER_THRESHOLDS", raising=False)
    assert "this GPU (NVIDIA Z9000) is not calibrated" in credit.thresholds_summary("NVIDIA Z9000")
    path = tmp_path / "h100.toml"
    path.write_text('format = 1\n[gpu]\nname = "NVIDIA H100 80GB HBM3"\n')
    monkeypatch.setenv("GRADER_THRESHOLDS", str(path))
    assert credit.thresholds_summary("NVIDIA Z9000") == (
        f"speed thresholds: {path} (calibrated on NVIDIA H100 80GB HBM3)")
    path.write_text("format = 2\n")
    assert "'format' must be 1" in credit.thresholds_summary("NVIDIA Z9000")


def test_grader_bench_times_each_benchmark_in_process_and_drops_a_broken_optional_baseline(monkeypatch):
    """``grader bench``'s table: each benchmark recorded and timed in this process with the student's own call beside
    its replay (``--in-process``); an optional baseline that raises is dropped and the benchmark measured again."""
    clock = FakeClock()
    part = _toy_part(clock)
    calls: list[tuple[str, list[str], list[str]]] = []

    def measure_replayed(part_, module, bench_, *, budget_s, baselines, extra):
        calls.append((bench_.label, list(baselines), sorted(extra)))
        if "copy" in baselines:
            return measure.BenchmarkTiming(bench_.label, error="the baseline 'copy' raised OSError: no",
                                           failed_baseline="copy")
        return measure.BenchmarkTiming(bench_.label)

    monkeypatch.setattr(bench, "measure_replayed", measure_replayed)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(bench.probes, "roofline", lambda dtypes: {})
    logged: list[str] = []
    result = bench.measure_part_table(part.exercise, part, _module(clock, 1.0), baselines=None, budget_s=1.0,
                                      in_process=True, log=logged.append)
    assert calls == [("n1024", ["torch", "copy", "extra"], [bench.IN_PROCESS]),
                     ("n1024", ["torch", "extra"], [bench.IN_PROCESS])]
    assert [r.label for r in result["rows"]] == ["n1024"] and not result["rows"][0].error
    assert any("dropping the baseline 'copy'" in line for line in logged)
