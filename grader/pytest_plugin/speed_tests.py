"""Speed tests (marker ``speed``), one per benchmark of a speed-graded part: ``test_<part>_speed[<label>]``.
CUDA only; on a CPU they are skipped with the reason.

A speed test

1. records the student's call once and times its kernels, replayed without the student's Python, against the
   part's speed baseline, interleaved (:mod:`grader.speed.trusted`: the grader's own timing; every timed
   output is re-checked and the replay is checked against the baseline) — the one timing, and what is graded;
2. gives pytest-benchmark the student's samples of that measurement (replayed through its timer, with no
   second timing), so the usual table, ``--benchmark-json``, ``--benchmark-autosave`` and
   ``--benchmark-compare`` show the device time that was graded;
3. calls the kernel once more on fresh inputs and checks the result against the float64 reference
   (in the test of the part's first benchmark: that reference is computed on the CPU);
4. fails below full credit, with the measured and required times, the ratio to the baseline, the
   achieved bandwidth/throughput and what usually causes the gap.
"""

from __future__ import annotations

import random
from functools import cache

import pytest

from grader.checks import verdicts
from grader.checks.spec import Benchmark, Exercise, Part
from grader.speed import credit, in_process, measure, probes
from grader.speed.thresholds import calibrated, speed_curves

BUDGET_S = 2.0  # seconds of interleaved timing per benchmark (it usually converges sooner)


@cache
def _thresholds() -> calibrated.Thresholds | None:
    return credit.load_thresholds()


class SampleReplayTimer:
    """A pytest-benchmark timer that hands back samples already measured: each ``before, after`` pair of
    calls is one sample apart, so pedantic mode on an empty target records exactly those samples."""

    def __init__(self) -> None:
        self.__name__ = "device time (graded measurement)"  # pytest-benchmark prints the timer's name
        self._samples_s: list[float] = []
        self._now = 0.0
        self._started = False

    def load(self, samples_ms: list[float]) -> None:
        self._samples_s = [ms / 1e3 for ms in samples_ms]

    def __call__(self) -> float:
        if self._started:
            self._now += self._samples_s.pop(0)
        self._started = not self._started
        return self._now


def speed_test(exercise: Exercise, part: Part):
    timer = SampleReplayTimer()

    @pytest.mark.speed
    @pytest.mark.benchmark(group=f"{exercise.name} {part.name}", timer=timer, disable_gc=False, warmup=False)
    @pytest.mark.parametrize("bench", part.benchmarks, ids=[b.label for b in part.benchmarks])
    def test(grader_session, request, benchmark, bench: Benchmark):
        if not grader_session.mode.is_cuda:
            pytest.skip(measure.CPU_REASON)
        module = grader_session.ready(exercise, part, request.node.path)
        try:
            limits = _thresholds()
        except calibrated.ThresholdsError as exc:
            pytest.fail(str(exc), pytrace=False)

        samples: list[float] = []
        row = in_process.measure_replayed(part, module, bench, budget_s=BUDGET_S, samples=samples)
        if row.error:
            pytest.fail(f"{exercise.name} {part.name} speed on {bench.label}: {row.error}", pytrace=False)
        timer.load(samples)
        benchmark.pedantic(lambda: None, rounds=len(samples), iterations=1, warmup_rounds=0)

        if bench.label == part.benchmarks[0].label:  # its float64 reference runs on the CPU: the first size only
            seed = random.SystemRandom().getrandbits(62)
            verdict = verdicts.run_case(part, module, measure.recheck_case(part, seed), "cuda")
            if not verdict.passed:
                pytest.fail(f"after the timed runs, on fresh inputs (secret seed {seed}): {verdict.message}",
                            pytrace=False)

        roofline = probes.roofline([bench.case.get("dtype")] if bench.flops else [])
        curve = speed_curves.curve_for(grader_session.curves, exercise.name, part.name)
        measurement = measure.SpeedMeasurement(grader_session.mode.gpu_name or "?", [row])
        verdict = credit.judge(part, measurement, recheck=verdicts.Verdict(True), thresholds=limits, curve=curve,
                               labels=[bench.label], roofline=roofline, require_calibration=False)
        if verdict.status == credit.FLAGGED:
            pytest.fail(f"{exercise.name} {part.name} speed on {bench.label}: {verdict.message}", pytrace=False)
        result = verdict.rows[0]
        benchmark.extra_info.update({k: getattr(result, k) for k in (
            "baseline", "baseline_ms", "student_ms", "ratio", "required_full", "required_partial", "credit",
            "gbps", "tflops", "pct_roofline", "threshold")})
        if verdict.fraction < 1.0:
            pytest.fail(f"{exercise.name} {part.name} is too slow — {verdict.message}\nwhere the time goes, kernel by "
                        f"kernel: grader profile {exercise.name} --part {part.name} --benchmark {bench.label}",
                        pytrace=False)

    test.__doc__ = (f"{exercise.title} ({part.name}): speed against {part.speed_baseline} on the GPU "
                    f"(pytest-benchmark table in device time)")
    return test
