"""Speed grading: time a part's kernel against its baselines, and turn the times into credit.

The work is split like :mod:`grader.check`, so the grader can put a process boundary in between:

* :func:`measure_part` runs where the student's module is imported (the grader's worker, or
  pytest). For every :class:`~grader.spec.Benchmark` of the part it times the student's
  ``part.call`` and the baselines interleaved (:mod:`grader.timing`), re-checks the output of
  every timed call, and finally calls the student's code once more on fresh inputs from a secretly
  seeded case of the first benchmark (list the cheapest first: its float64 reference runs on the
  CPU). It returns plain data, plus the outputs of that last call under ``"recheck"``.
* :func:`score_part` needs only that data and the thresholds of the GPU (:mod:`grader.thresholds`);
  it never imports student code. Ratios are ``baseline_ms / student_ms`` — the student's speed in
  units of the baseline measured in the same run — and credit is linear between the thresholds'
  ``partial`` and ``full`` ratios.

On a CPU nothing is timed: the kernels run in the Triton interpreter, whose speed says nothing
about the GPU.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

import torch

from grader import check, timing
from grader import thresholds as thresholds_mod
from grader.cases import mixed_seed
from grader.spec import Benchmark, Case, Part
from grader.thresholds import Threshold, Thresholds

CPU_REASON = "speed tests need a CUDA GPU: kernels are running in the Triton interpreter"
NOT_MEASURED = "not measured: no GPU"
STUDENT = "student"  # the student's candidate in measurements

MEMORY_HINTS = (
    "BLOCK too small: each program moves too few bytes to hide memory latency (try >= 1024 elements per program)",
    "uncoalesced loads: neighbouring lanes must touch neighbouring addresses (tl.arange along the contiguous dim)",
    "extra passes over memory: read each input element once and write each output element once",
    "too few warps, or too few loads in flight per thread, for the block size (num_warps)",
)
COMPUTE_HINTS = (
    "tiles too small for tl.dot: 64x64 or larger blocks keep the tensor cores busy",
    "materialized scores: an intermediate (e.g. the NxN attention scores) goes through memory instead of staying "
    "on-chip",
    "tl.dot operands in fp32 instead of fp16/bf16, or products accumulated outside tl.dot",
    "no software pipelining (num_stages) or poor L2 reuse (grouped program order)",
)


# --------------------------------------------------------------------------------------------
# Measuring (imports and runs the student's code)
# --------------------------------------------------------------------------------------------


def exercise_of(part: Part) -> str | None:
    from grader import exercises

    for exercise in exercises.all_exercises():
        if any(p is part for p in exercise.parts):
            return exercise.name
    return None


def grading_baselines(part: Part) -> list[str]:
    """Baselines timed when grading: the speed baseline, and the device copy when declared (it
    shows in the report what the bandwidth allows)."""
    names = [part.speed_baseline] if part.speed_baseline else []
    if "copy" in part.baselines and "copy" not in names:
        names.append("copy")
    return names


_INPUTS: OrderedDict[str, dict[str, Any]] = OrderedDict()
_INPUTS_KEPT = 12


def cpu_inputs(part: Part, case: Case) -> dict[str, Any]:
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


def input_sets(part: Part, bench: Benchmark, sets: int = 2) -> list[dict[str, Any]]:
    """The benchmark's inputs for seeds ``case.seed, case.seed + 1, ...`` (CPU)."""
    return [cpu_inputs(part, bench.case.with_seed(bench.case.seed + i)) for i in range(sets)]


def _type_summary(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {type(v).__name__}" for k, v in value.items()) + "}"
    return type(value).__name__


def output_checker(part: Part, case: Case, device: str):
    """A ``check(output, set_index)`` for :class:`timing.Candidate`: the first output for each
    input set is remembered; later outputs for that set must match it within the part's tolerance,
    and the results for two different input sets must differ (else: a cached result)."""
    expected: dict[int, dict[str, torch.Tensor]] = {}
    function = part.functions[0]

    def check_output(output: Any, index: int) -> str | None:
        if not isinstance(output, dict) or not all(isinstance(v, torch.Tensor) for v in output.values()):
            return f"{function} returned {_type_summary(output)}, expected tensors"
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
    module: ModuleType,
    bench: Benchmark,
    *,
    device: str,
    budget_s: float = 2.0,
    baselines: list[str] | None = None,
    clock: timing.Clock | None = None,
    rule: timing.StopRule | None = None,
    sets: int = 2,
    warmup_ms: float = 25.0,
    graph_below_ms: float | None = 0.02,
) -> dict[str, Any]:
    """Time the student's call and ``baselines`` (default: :func:`grading_baselines`) on one
    benchmark. Returns a JSON-able row; ``row["error"]`` says what went wrong, if anything."""
    baselines = grading_baselines(part) if baselines is None else list(baselines)
    unknown = [b for b in baselines if b not in part.baselines]
    if unknown:
        known = ", ".join(part.baselines)
        raise ValueError(f"part {part.name!r} declares no baseline {', '.join(unknown)} (has: {known})")
    cpu = input_sets(part, bench, sets)
    row: dict[str, Any] = {
        "label": bench.label,
        "case": bench.case.to_dict(),
        "dtype": bench.case.get("dtype"),
        "baseline": part.speed_baseline,
        "bytes": float(bench.bytes_moved(cpu[0])) if bench.bytes_moved else None,
        "flops": float(bench.flops(cpu[0])) if bench.flops else None,
    }
    candidates = [timing.Candidate(STUDENT, lambda inputs: part.call(module, inputs),
                                   output_checker(part, bench.case, device))]
    candidates += [timing.Candidate(name, part.baselines[name]) for name in baselines]
    sources = [check.device_inputs(inputs, device) for inputs in cpu]
    try:
        result = timing.measure(
            candidates, sources,
            clock=clock or timing.CudaClock(),
            rule=rule or timing.StopRule(budget_s=budget_s),
            warmup_ms=warmup_ms,
            graph_below_ms=graph_below_ms,
        )
    except timing.CandidateError as exc:
        if exc.name == STUDENT and isinstance(exc.error, NotImplementedError):
            row["error"] = f"{' / '.join(part.functions)} is not implemented yet"
            row["not_implemented"] = True
        elif exc.name == STUDENT:
            row["error"] = f"{part.functions[0]} raised {check._format_exception(exc.error)}"
        else:
            row["error"] = f"the baseline {exc.name!r} raised {type(exc.error).__name__}: {exc.error}"
            row["failed_baseline"] = exc.name
        return row
    finally:
        del sources
        if device == "cuda":
            torch.cuda.empty_cache()
    row.update(result.to_dict())
    if result.problems:
        row["error"] = result.problems[0]
    return row


def recheck_case(part: Part, secret_seed: int) -> Case:
    """The case of the part's *first* benchmark, seeded from ``secret_seed`` so that its inputs
    differ from every timed input. Its float64 reference is computed on the CPU, so an exercise
    lists its cheapest benchmark first."""
    bench = part.benchmarks[0]
    return bench.case.with_seed(mixed_seed(str(secret_seed), "speed-recheck", part.name, bench.label))


def recheck(part: Part, module: ModuleType, case: Case, device: str) -> dict[str, Any]:
    """Call the student's code on ``case`` (under the same monitor as the correctness checks) and
    keep what :func:`judge_recheck` needs."""
    ex = check.execute(part, module, case, device)
    return {
        "case": case.to_dict(),
        "outputs": ex.outputs,
        "output_devices": ex.output_devices,
        "error_kind": ex.error_kind,
        "error": ex.error,
    }


def recheck_execution(entry: dict[str, Any]) -> check.Execution:
    return check.Execution(
        outputs=entry.get("outputs"),
        output_devices=dict(entry.get("output_devices") or {}),
        error_kind=entry.get("error_kind"),
        error=entry.get("error"),
    )


def judge_recheck(part: Part, measurement: dict[str, Any], device: str = "cuda") -> check.Verdict:
    """Correctness of the post-timing call(s) on fresh inputs (never imports student code)."""
    for entry in measurement.get("recheck", []):
        verdict = check.judge(part, Case.from_dict(entry["case"]), recheck_execution(entry), device)
        if not verdict.passed:
            return check.Verdict(False, "on fresh inputs after the timed runs, " + verdict.message)
    return check.Verdict(True)


def _flop_dtypes(part: Part) -> list[str]:
    return sorted({b.case.get("dtype") for b in part.benchmarks if b.flops and b.case.get("dtype")})


def measure_part(
    part: Part, module: ModuleType, *, device: str, secret_seed: int = 0, budget_s: float = 20.0
) -> dict[str, Any]:
    """Measure every benchmark of ``part`` (see the module docstring). ``budget_s`` is shared by
    the benchmarks' timing loops (warm-up, compilation and input building come on top)."""
    if device != "cuda":
        return {"skipped": NOT_MEASURED}
    if not part.benchmarks:
        return {"skipped": "this part has no speed benchmarks"}
    if part.speed_points <= 0:
        return {"skipped": "this part is not speed-graded (speed_points = 0)"}
    measurement: dict[str, Any] = {
        "exercise": exercise_of(part),
        "part": part.name,
        "gpu": torch.cuda.get_device_name(),
        "device": device,
        "baseline": part.speed_baseline,
        "budget_s": budget_s,
        "roofline": timing.roofline(_flop_dtypes(part)),
        "benchmarks": [],
        "recheck": [],
    }
    per_benchmark = budget_s / len(part.benchmarks)
    for bench in part.benchmarks:
        row = measure_benchmark(part, module, bench, device=device, budget_s=per_benchmark)
        measurement["benchmarks"].append(row)
        if row.get("error"):
            return measurement  # nothing to recheck: the speed credit is already zero
    measurement["recheck"].append(recheck(part, module, recheck_case(part, secret_seed), device))
    return measurement


# --------------------------------------------------------------------------------------------
# Scoring (plain data in, never student code)
# --------------------------------------------------------------------------------------------


@dataclass
class SpeedScore:
    fraction: float  # in [0, 1]: the mean credit over the part's benchmarks
    message: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    calibrated: bool = False  # every benchmark scored against this GPU's own thresholds file
    skipped: str | None = None  # why nothing was measured (e.g. no GPU)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_thresholds(gpu_name: str | None = None) -> Thresholds | None:
    """This GPU's thresholds (``$GRADER_THRESHOLDS`` first); None when it is not calibrated.
    Raises :class:`grader.thresholds.ThresholdsError` for an invalid file."""
    if gpu_name is None:
        if not torch.cuda.is_available():
            return None
        gpu_name = torch.cuda.get_device_name()
    return thresholds_mod.find(gpu_name)


def thresholds_summary(gpu_name: str | None = None) -> str:
    """One line for the pytest header: which thresholds the speed tests use on this GPU."""
    try:
        gpu_name = gpu_name or torch.cuda.get_device_name()
        found = load_thresholds(gpu_name)
    except thresholds_mod.ThresholdsError as exc:
        return f"speed thresholds: {exc}"
    if found is None:
        return (f"speed thresholds: this GPU ({gpu_name}) is not calibrated — speed tests use the calibrated GPUs' "
                "ratios (`grader calibrate` makes its file)")
    return f"speed thresholds: {found.where} (calibrated on {found.gpu})"


def resolve_threshold(
    exercise: str, part: Part, label: str, baseline: str | None, thresholds: Thresholds | None
) -> tuple[Threshold, str]:
    """The threshold for one benchmark and where it comes from: "calibrated" (this GPU's file),
    "portable" (the most lenient calibrated GPU) or "default"."""
    baseline = baseline or part.speed_baseline or "?"
    if thresholds is not None:
        entry = thresholds.get(exercise, part.name, label)
        if entry is not None and entry.baseline == baseline:
            return entry, "calibrated"
    entries, _ = _portable()
    entry = entries.get((exercise, part.name, label))
    if entry is not None and entry.baseline == baseline:
        return entry, "portable"
    return thresholds_mod.default(baseline), "default"


def _portable():
    return thresholds_mod.portable()


def _median(row: dict[str, Any], name: str) -> float | None:
    stats = (row.get("times") or {}).get(name)
    return float(stats["median"]) if stats else None


def score_row(row: dict[str, Any] | None, label: str, threshold: Threshold, source: str,
              roofline: dict[str, Any]) -> dict[str, Any]:
    """One benchmark's numbers and credit."""
    out: dict[str, Any] = {
        "label": label, "baseline": threshold.baseline, "student_ms": None, "baseline_ms": None, "ratio": None,
        "required_full": threshold.full, "required_partial": threshold.partial, "credit": 0.0,
        "gbps": None, "tflops": None, "pct_roofline": None, "bound": None, "threshold": source,
        "reference_ms": threshold.reference_ms if source == "calibrated" else None, "error": None,
    }
    if row is None:
        out["error"] = "not measured"
        return out
    if row.get("error"):
        out["error"] = row["error"]
        return out
    student_ms, baseline_ms = _median(row, STUDENT), _median(row, threshold.baseline)
    if student_ms is None or baseline_ms is None:
        out["error"] = f"no time for {'the student' if student_ms is None else threshold.baseline}"
        return out
    if student_ms <= 0:
        out["error"] = "measured no time at all (the timer saw no work)"
        return out
    times = row["times"][STUDENT]
    ratio = baseline_ms / student_ms
    out.update(student_ms=student_ms, baseline_ms=baseline_ms, ratio=ratio, credit=threshold.credit(ratio),
               spread=timing.Stats.from_dict(times).robust_cv, copy_ms=_median(row, "copy"),
               mode=row.get("mode"), rounds=row.get("rounds"))
    out.update(roofline_numbers(row.get("bytes"), row.get("flops"), student_ms, row.get("dtype"), roofline))
    return out


def roofline_numbers(nbytes: float | None, flops: float | None, ms: float, dtype: str | None,
                     roofline: dict[str, Any]) -> dict[str, Any]:
    """Achieved GB/s and TFLOP/s, and the percentage of the roofline: the time the roofs allow
    (``max(bytes / bandwidth, flops / peak)``) over the time measured."""
    seconds = ms * 1e-3
    bw = roofline.get("copy_gbps")
    peak = (roofline.get("matmul_tflops") or {}).get(dtype) if dtype else None
    gbps = nbytes / seconds / 1e9 if nbytes else None
    tflops = flops / seconds / 1e12 if flops else None
    bounds = []
    if nbytes and bw:
        bounds.append(("memory", nbytes / (bw * 1e9)))
    if flops and peak:
        bounds.append(("compute", flops / (peak * 1e12)))
    if not bounds:
        bound = "memory" if nbytes and not flops else "compute" if flops and not nbytes else None
        return {"gbps": gbps, "tflops": tflops, "pct_roofline": None, "bound": bound}
    bound, best = max(bounds, key=lambda b: b[1])
    return {"gbps": gbps, "tflops": tflops, "pct_roofline": 100.0 * best / seconds, "bound": bound}


def _fmt_ms(ms: float | None) -> str:
    if ms is None or not math.isfinite(ms):
        return "?"
    return f"{ms:.3f} ms" if ms >= 0.1 else f"{ms * 1e3:.1f} µs"


def row_message(r: dict[str, Any], roofline: dict[str, Any]) -> str:
    """One benchmark, for a student: measured vs required, ratio, achieved rates, likely causes."""
    label, base = r["label"], r["baseline"]
    if r.get("error"):
        return f"{label}: no speed credit — {r['error']}"
    head = (f"{label}: {_fmt_ms(r['student_ms'])} = {r['ratio']:.2f}× the speed of {base} "
            f"({_fmt_ms(r['baseline_ms'])})")
    if r["credit"] >= 1.0:
        return f"{head}; full credit from {r['required_full']:.2f}× — ok"
    need_ms = r["baseline_ms"] / r["required_full"]
    floor_ms = r["baseline_ms"] / r["required_partial"]
    lines = [
        f"{head}; credit {r['credit']:.0%}",
        f"    required: {r['required_full']:.2f}× {base} (≤ {_fmt_ms(need_ms)}) for full credit, "
        f"above {r['required_partial']:.2f}× (< {_fmt_ms(floor_ms)}) for partial credit",
    ]
    achieved = []
    if r.get("gbps") is not None:
        bw = roofline.get("copy_gbps")
        of = f" = {100 * r['gbps'] / bw:.0f}% of the copy bandwidth ({bw:.0f} GB/s measured)" if bw else ""
        achieved.append(f"{r['gbps']:.0f} GB/s{of}")
    if r.get("tflops") is not None:
        achieved.append(f"{r['tflops']:.2f} TFLOP/s")
    if r.get("pct_roofline") is not None:
        achieved.append(f"{r['pct_roofline']:.0f}% of the roofline")
    if achieved:
        lines.append("    achieved: " + "; ".join(achieved))
    if r.get("copy_ms"):
        lines.append(f"    a plain copy of the same data takes {_fmt_ms(r['copy_ms'])}")
    hints = COMPUTE_HINTS if r.get("bound") == "compute" else MEMORY_HINTS
    kind = "compute-bound" if r.get("bound") == "compute" else "memory-bound"
    lines.append(f"    what usually causes the gap ({kind} kernel):")
    lines += [f"      - {h}" for h in hints]
    return "\n".join(lines)


def calibration_note(gpu: str, rows: list[dict[str, Any]], thresholds: Thresholds | None) -> str:
    sources = {r["threshold"] for r in rows}
    if sources == {"calibrated"} and thresholds is not None:
        return f"thresholds: {thresholds.where} (calibrated on {thresholds.gpu})"
    try:
        expected = thresholds_mod.path_for(gpu)
        where = thresholds_mod._display(expected)
    except thresholds_mod.ThresholdsError:
        where = "a thresholds file"
    _, used = _portable()
    basis = (f"the most lenient ratios of the calibrated GPUs ({', '.join(used)})" if "portable" in sources
             else f"default ratios ({thresholds_mod.DEFAULT_FULL}× {rows[0]['baseline'] if rows else 'baseline'} "
                  "for full credit)")
    missing = "" if thresholds is None else f" ({thresholds.where} has no entry for some benchmarks)"
    return (f"this GPU ({gpu}) is not calibrated{missing}: no {where}; required speeds are {basis}. "
            "Run `grader calibrate` on it to calibrate")


def score_part(part: Part, measurement: dict[str, Any], *, thresholds: Thresholds | None) -> SpeedScore:
    """Credit for a part from :func:`measure_part`'s data. The post-timing recheck entries still in
    ``measurement["recheck"]`` are judged here (a wrong result zeroes the credit); a caller that
    judges them itself removes them, or stores ``measurement["recheck_verdict"]`` (``Verdict.to_dict()``)."""
    if "skipped" in measurement:
        return SpeedScore(0.0, f"speed {measurement['skipped']}", [], False, skipped=measurement["skipped"])
    exercise = measurement.get("exercise") or exercise_of(part) or "?"
    roofline = measurement.get("roofline") or {}
    measured = {r["label"]: r for r in measurement.get("benchmarks", [])}
    rows = []
    for bench in part.benchmarks:
        row = measured.get(bench.label)
        threshold, source = resolve_threshold(exercise, part, bench.label, part.speed_baseline, thresholds)
        rows.append(score_row(row, bench.label, threshold, source, roofline))
    gpu = measurement.get("gpu", "?")
    return _summary(rows, roofline, gpu, thresholds, _recheck_verdict(part, measurement))


def score_benchmark(part: Part, row: dict[str, Any], *, exercise: str, gpu: str, roofline: dict[str, Any],
                    thresholds: Thresholds | None) -> SpeedScore:
    """Credit for one measured benchmark (the per-benchmark pytest speed test)."""
    threshold, source = resolve_threshold(exercise, part, row["label"], part.speed_baseline, thresholds)
    return _summary([score_row(row, row["label"], threshold, source, roofline)], roofline, gpu, thresholds,
                    check.Verdict(True))


def _recheck_verdict(part: Part, measurement: dict[str, Any]) -> check.Verdict:
    given = measurement.get("recheck_verdict")
    if given is not None:
        return check.Verdict(bool(given["passed"]), given.get("message", ""))
    if not measurement.get("recheck"):
        # Nothing to judge here: a benchmark failed first (it says why), or the caller took the
        # entries out to judge them itself (the grader does, in its verdict process).
        return check.Verdict(True)
    return judge_recheck(part, measurement, measurement.get("device", "cuda"))


def _summary(rows: list[dict[str, Any]], roofline: dict[str, Any], gpu: str, thresholds: Thresholds | None,
             recheck: check.Verdict) -> SpeedScore:
    calibrated = bool(rows) and all(r["threshold"] == "calibrated" for r in rows)
    note = calibration_note(gpu, rows, thresholds)
    if not recheck.passed:
        for r in rows:
            r["credit"] = 0.0
        return SpeedScore(0.0, f"speed: no credit — {recheck.message}\n{note}", rows, calibrated)
    fraction = statistics.fmean(r["credit"] for r in rows) if rows else 0.0
    full = sum(r["credit"] >= 1.0 for r in rows)
    plural = "s" if len(rows) != 1 else ""
    head = f"speed: {fraction:.0%} ({full} of {len(rows)} benchmark{plural} at full speed) on {gpu}"
    body = "\n".join(row_message(r, roofline) for r in rows)
    return SpeedScore(fraction, f"{head}\n{body}\n{note}", rows, calibrated)
