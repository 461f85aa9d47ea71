"""Speed tests (marker ``speed``), generated from each speed-graded part's benchmarks: one test per
benchmark, ``test_<part>_speed[<label>]``. CUDA only; on a CPU they are skipped with the reason.

A speed test

1. times the student's kernel against the part's speed baseline, interleaved (:mod:`grader.speed`;
   every timed output is re-checked) — this is what is graded;
2. hands the student's kernel to pytest-benchmark in pedantic mode with a CUDA-event timer, so the
   usual table, ``--benchmark-json``, ``--benchmark-autosave`` and ``--benchmark-compare`` work and
   show device time (fresh inputs and an L2 flush before every round, outputs re-checked after);
3. calls the kernel once more on fresh inputs and checks the result against the float64 reference
   (in the test of the part's first benchmark: that reference is computed on the CPU);
4. fails below full credit, with the measured and required times, the ratio to the baseline, the
   achieved bandwidth/throughput and what usually causes the gap.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from grader import check, speed, thresholds, timing
from grader.spec import Benchmark, Case, Exercise, Part

BUDGET_S = 2.0  # seconds of interleaved timing per benchmark (it usually converges sooner)


def speed_tests(exercise: Exercise) -> dict[str, Callable]:
    return {
        f"test_{part.name}_speed": _speed_test(exercise, part)
        for part in exercise.parts
        if part.benchmarks and part.speed_points > 0
    }


@cache
def _thresholds() -> thresholds.Thresholds | None:
    return speed.load_thresholds()


def _speed_test(exercise: Exercise, part: Part):
    timer = timing.CudaEventTimer()

    @pytest.mark.speed
    @pytest.mark.benchmark(group=f"{exercise.name} {part.name}", timer=timer)
    @pytest.mark.parametrize("bench", part.benchmarks, ids=[b.label for b in part.benchmarks])
    def test(grader_session, request, benchmark, bench: Benchmark):
        if not grader_session.mode.is_cuda:
            pytest.skip(speed.CPU_REASON)
        module = grader_session.ready(exercise, part, Path(str(request.node.path)))
        try:
            limits = _thresholds()
        except thresholds.ThresholdsError as exc:
            pytest.fail(str(exc), pytrace=False)

        row = speed.measure_benchmark(part, module, bench, device="cuda", budget_s=BUDGET_S)
        if row.get("error"):
            pytest.fail(f"{exercise.name} {part.name} speed on {bench.label}: {row['error']}", pytrace=False)

        problems = _pytest_benchmark(benchmark, timer, part, module, bench, row)
        if problems:
            pytest.fail(f"{exercise.name} {part.name} speed on {bench.label}: {problems[0]}", pytrace=False)

        if bench.label == part.benchmarks[0].label:  # its float64 reference runs on the CPU: the first size only
            seed = random.SystemRandom().getrandbits(62)
            entry = speed.recheck(part, module, speed.recheck_case(part, seed), "cuda")
            verdict = check.judge(part, Case.from_dict(entry["case"]), speed.recheck_execution(entry), "cuda")
            if not verdict.passed:
                pytest.fail(f"after the timed runs, on fresh inputs (secret seed {seed}): {verdict.message}",
                            pytrace=False)

        import torch

        roofline = timing.roofline([bench.case.get("dtype")] if bench.flops else [])
        score = speed.score_benchmark(part, row, exercise=exercise.name, gpu=torch.cuda.get_device_name(),
                                      roofline=roofline, thresholds=limits)
        result = score.rows[0]
        benchmark.extra_info.update({k: result.get(k) for k in (
            "baseline", "baseline_ms", "student_ms", "ratio", "required_full", "required_partial", "credit",
            "gbps", "tflops", "pct_roofline", "threshold")})
        if score.fraction < 1.0:
            pytest.fail(f"{exercise.name} {part.name} is too slow — {score.message}", pytrace=False)

    test.__doc__ = (f"{exercise.title} ({part.name}): speed against {part.speed_baseline} on the GPU "
                    f"(pytest-benchmark table in device time)")
    return test


def _pytest_benchmark(benchmark, timer: timing.CudaEventTimer, part: Part, module, bench: Benchmark,
                      row: dict[str, Any]) -> list[str]:
    """pytest-benchmark's pedantic mode on the student's call, in device time. Returns problems
    found when re-checking the outputs of the rounds."""
    sources = [check.device_inputs(inputs, "cuda") for inputs in speed.input_sets(part, bench)]
    clock = timing.CudaClock()
    checker = speed.output_checker(part, bench.case, "cuda")
    state: dict[str, Any] = {"round": 0}
    problems: list[str] = []

    def setup():
        index = state["round"] % len(sources)
        state["round"] += 1
        state["set"] = index
        inputs = timing.fresh_inputs(sources[index])
        clock.flush()  # also keeps the GPU busy while the call is launched
        timer.arm()
        return (inputs,), {}

    def target(inputs):
        state["out"] = part.call(module, inputs)

    def teardown(inputs):
        problem = checker(state.pop("out", None), state["set"])
        if problem and not problems:
            problems.append(problem)

    ms = row["times"][speed.STUDENT]["median"]
    rounds = max(10, min(100, int(500 / (ms + 0.5))))
    benchmark.pedantic(target, setup=setup, teardown=teardown, rounds=rounds, warmup_rounds=2)
    return problems
