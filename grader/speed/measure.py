"""Measuring a part's speed: what a measurement holds (:class:`BenchmarkTiming`, :class:`SpeedMeasurement`), the
benchmark's inputs, and the timing of one benchmark, :func:`measure_benchmark`: its candidates (the student's
replayed plan, the baselines, the reference's replay beside it) interleaved by :mod:`grader.speed.timing`, every
timed output re-checked. It never runs the student's Python: the trusted timer imports it; the student's call is run
and recorded by :mod:`grader.speed.student_calls`. The credit is computed from the result by
:mod:`grader.speed.credit`.

On a CPU nothing is timed: the kernels run in the Triton interpreter, whose speed says nothing about the GPU.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from grader.checks import tensors
from grader.checks.call_records import Execution
from grader.checks.cases import mixed_seed
from grader.checks.spec import Benchmark, Case, Inputs, Part
from grader.checks.student_errors import student_traceback, type_summary
from grader.checks.tensors import device_inputs
from grader.speed import clocks, timing
from grader.speed.plan import LaunchPlan
from grader.speed.stats import Stats, StopRule, drift, paired_ratio

CPU_REASON = "speed tests need a CUDA GPU: kernels are running in the Triton interpreter"
STUDENT = "student"  # the student's candidate in measurements
REFERENCE = "reference"  # the reference solution's replayed kernels, timed in the same rounds (the yardstick)


@dataclass
class BenchmarkTiming:
    """One benchmark as measured: every candidate's time statistics (ms), or why there are none."""

    label: str
    times: dict[str, Stats] = field(default_factory=dict)  # candidate -> statistics
    mode: str = ""  # "events" or "graph"
    stop: str = ""  # why the rounds stopped
    rounds: int = 0
    notes: list[str] = field(default_factory=list)
    warmup_s: float = 0.0  # compilation, autotuning and warm-up calls (wall time)
    timed_s: float = 0.0  # the timed rounds (wall time)
    error: str | None = None  # no credit: what went wrong
    not_implemented: bool = False
    failed_baseline: str | None = None  # the baseline that raised (grader bench drops it and measures again)
    # Timed beside the reference (the yardstick): reference_ms / student_ms from the paired rounds, with its interval
    # (stats.RatioInterval.to_dict()), and how far the reference's own time moved during the rounds (relative).
    yardstick: dict[str, float] | None = None
    yardstick_drift: float | None = None

    def median(self, name: str) -> float | None:
        stats = self.times.get(name)
        return stats.median if stats else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["times"] = {name: stats.to_dict() for name, stats in self.times.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchmarkTiming:
        data = dict(data)
        data["times"] = {name: Stats.from_dict(stats) for name, stats in data.get("times", {}).items()}
        return cls(**data)


@dataclass
class SpeedMeasurement:
    """A part's speed as measured in the student's process: plain data for the credit to judge."""

    gpu: str
    benchmarks: list[BenchmarkTiming] = field(default_factory=list)
    gpu_state: list[dict[str, Any]] = field(default_factory=list)  # the GPU before and after the timed rounds
    recheck: Execution | None = None  # the call on fresh inputs after the timed runs (None: not reached)
    tampered: list[str] = field(default_factory=list)  # timing primitives replaced since the worker started
    plans: dict[str, LaunchPlan | str] = field(default_factory=dict)  # label -> plan, or why it has none
    mismatches: list[str] = field(default_factory=list)  # replays that did not compute the function
    # The recheck's outputs are bit for bit those of the first benchmark's recorded call, on other inputs: the
    # evidence of a cached or replayed result (a wrong recheck without it is a wrong result, not a flag).
    recheck_repeats: bool = False
    timer_fault: str | None = None  # the trusted timer failed on the grader's side (speed needs a regrade)
    # label -> the reference solution's kernels and their configs, as the yardstick's recording launched them
    reference_configs: dict[str, list[str]] = field(default_factory=dict)

    @property
    def error(self) -> str | None:
        return next((b.error for b in self.benchmarks if b.error), None)


def grading_baselines(part: Part) -> list[str]:
    """Baselines timed when grading: the speed baseline, and the device copy when declared (it
    shows in the report what the bandwidth allows)."""
    names = [part.speed_baseline] if part.speed_baseline else []
    if "copy" in part.baselines and "copy" not in names:
        names.append("copy")
    return names


_INPUTS: OrderedDict[str, Inputs] = OrderedDict()
_INPUTS_KEPT = 12


def cpu_inputs(part: Part, case: Case) -> Inputs:
    """``part.make_inputs(case)``, remembered for a few cases: benchmark inputs are large and
    building them on the CPU takes seconds."""
    key = f"{id(part)}:{json.dumps(case.to_dict(), sort_keys=True, default=str)}"
    if key in _INPUTS:
        _INPUTS.move_to_end(key)
        return _INPUTS[key]
    inputs = part.make_inputs(case)
    _INPUTS[key] = inputs
    while len(_INPUTS) > _INPUTS_KEPT:
        _INPUTS.popitem(last=False)
    return inputs


def input_sets(part: Part, bench: Benchmark, sets: int = 2, *, device: str = "cpu") -> list[Inputs]:
    """The benchmark's inputs for seeds ``case.seed, case.seed + 1, ...``, on ``device``. A GPU draws them
    itself (:func:`grader.checks.tensors.generated_on`): timing needs the sizes, layouts and distributions,
    not the CPU's exact values, and the CPU takes seconds per set at benchmark size."""
    seeds = [bench.case.with_seed(bench.case.seed + i) for i in range(sets)]
    if device == "cpu":
        return [cpu_inputs(part, case) for case in seeds]
    with tensors.generated_on(device):
        return [part.make_inputs(case) for case in seeds]


def output_checker(part: Part, case: Case, device: str):
    """A ``check(output, set_index)`` for :class:`timing.Candidate`: the first output for each
    input set is remembered; later outputs for that set must match it within the part's tolerance,
    and the results for two different input sets must differ (else: a cached result)."""
    expected: dict[int, dict[str, torch.Tensor]] = {}
    function = part.functions[0]

    def check_output(output: Any, index: int) -> str | None:
        if not isinstance(output, dict) or not all(isinstance(v, torch.Tensor) for v in output.values()):
            return f"{function} returned {type_summary(output)}, expected tensors"
        if index not in expected:
            first = expected.get(0)
            if first is not None and all(
                k in output and output[k].shape == v.shape and output[k].dtype == v.dtype and torch.equal(output[k], v)
                for k, v in first.items()
            ):
                return (f"{function} returned the same result for two different inputs of the benchmark — a result "
                        "cached from an earlier call? Speed is only measured for code that computes on every call")
            expected[index] = {k: v.detach().clone() for k, v in output.items()}
            return None
        for name, want in expected[index].items():
            got = output.get(name)
            if got is None or got.shape != want.shape or got.dtype != want.dtype:
                return f"{function}'s output {name!r} in a timed run has the wrong shape or dtype"
            tol = part.tolerance(name, case.dtype, device)
            if not bool(torch.isclose(got, want, rtol=tol.rtol, atol=tol.atol, equal_nan=True).all()):
                return (f"{function}'s output {name!r} in a timed run differs from its result for the same input — "
                        "a result cached from an earlier call? Each timed run must compute its own output")
        return None

    return check_output


def measure_benchmark(
    part: Part,
    call: Callable[[Inputs], Any],
    bench: Benchmark,
    *,
    device: str,
    budget_s: float = 2.0,
    baselines: list[str] | None = None,
    clock: clocks.Clock | None = None,
    rule: StopRule | None = None,
    sets: int = 2,
    warmup_ms: float = 25.0,
    graph_below_ms: float | None = 0.02,
    samples: list[float] | None = None,
    extra: Mapping[str, Callable[[Inputs], Any]] | None = None,
) -> BenchmarkTiming:
    """Time ``call`` (the student's candidate: the replayed kernels, or the student's own call where a test
    double stands in for the GPU) and ``baselines`` (default: :func:`grading_baselines`) on one benchmark.
    ``samples``, if given, receives the student's timed samples (ms), in round order; ``extra`` names more
    candidates to time in the same rounds (``grader bench --in-process``)."""
    baselines = grading_baselines(part) if baselines is None else list(baselines)
    unknown = [b for b in baselines if b not in part.baselines]
    if unknown:
        known = ", ".join(part.baselines)
        raise ValueError(f"part {part.name!r} declares no baseline {', '.join(unknown)} (has: {known})")
    row = BenchmarkTiming(bench.label)
    # a replay's outputs and scratch are poisoned before every call, outside the timed region (Replay.stage)
    candidates = [timing.Candidate(STUDENT, call, output_checker(part, bench.case, device),
                                   setup=getattr(call, "stage", None))]
    candidates += [timing.Candidate(name, part.baselines[name]) for name in baselines]
    candidates += [timing.Candidate(name, fn, setup=getattr(fn, "stage", None)) for name, fn in (extra or {}).items()]
    sources = input_sets(part, bench, sets, device=device)
    if device == "cpu":
        sources = [device_inputs(inputs, device) for inputs in sources]  # fresh copies of the remembered sets
    try:
        result = timing.measure(
            candidates, sources,
            clock=clock or clocks.CudaClock(),
            rule=rule or StopRule(budget_s=budget_s),
            warmup_ms=warmup_ms,
            graph_below_ms=graph_below_ms,
        )
    except timing.CandidateError as exc:
        if exc.name == STUDENT and isinstance(exc.error, NotImplementedError):
            row.error = f"{' / '.join(part.functions)} is not implemented yet"
            row.not_implemented = True
        elif exc.name == STUDENT:
            row.error = f"{part.functions[0]} raised {student_traceback(exc.error)}"
        else:
            row.error = f"the baseline {exc.name!r} raised {type(exc.error).__name__}: {exc.error}"
            row.failed_baseline = exc.name
        return row
    finally:
        del sources
        if device == "cuda":
            torch.cuda.empty_cache()
    row.times = {name: result.stats(name) for name, timed in result.samples.items() if timed}
    if result.samples.get(REFERENCE) and result.samples.get(STUDENT):
        interval = paired_ratio(result.samples, REFERENCE, STUDENT)
        row.yardstick = interval.to_dict() if interval is not None else None
        row.yardstick_drift = drift(result.samples[REFERENCE])
    if samples is not None:
        samples.extend(result.samples[STUDENT])
    row.mode, row.stop, row.rounds, row.notes = result.mode, result.stop, result.rounds, list(result.notes)
    row.warmup_s, row.timed_s = result.warmup_s, result.timed_s
    if result.problems:
        row.error = result.problems[0]
    return row


def recheck_case(part: Part, secret_seed: int) -> Case:
    """The case of the part's *first* benchmark, seeded from ``secret_seed`` so that its inputs
    differ from every timed input. Its float64 reference may be computed on the CPU (a GPU's that did not fit
    the grader's share), so an exercise lists its cheapest benchmark first."""
    bench = part.benchmarks[0]
    return bench.case.with_seed(mixed_seed(str(secret_seed), "speed-recheck", part.name, bench.label))
