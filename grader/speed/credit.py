"""Speed credit: turn a :class:`~grader.speed.measure.SpeedMeasurement` into credit and a message. Plain
data in, never student code: the grader runs this in its verdict process.

Ratios are ``baseline_ms / student_ms`` — the student's speed in units of the baseline measured in the
same run — and credit is linear between the thresholds' ``partial`` and ``full`` ratios
(:mod:`grader.speed.thresholds`). The messages give the measured and required times, the ratio, the
achieved bandwidth and throughput against this GPU's roofline, and what usually causes a gap.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from grader.checks.spec import Benchmark, Part
from grader.checks.verdicts import Verdict
from grader.speed import limits as limits_mod
from grader.speed import thresholds as thresholds_mod
from grader.speed.measure import STUDENT, BenchmarkTiming, SpeedMeasurement, cpu_inputs
from grader.speed.thresholds import Threshold, Thresholds

MEMORY_HINTS = (
    "BLOCK too small: each program moves too few bytes to hide memory latency (try >= 1024 elements per program)",
    "uncoalesced loads: neighbouring lanes must touch neighbouring addresses (tl.arange along the contiguous dim)",
    "extra passes over memory: read each input element once and write each output element once",
    "too few warps, or too few loads in flight per thread, for the block size (num_warps)",
)
COMPUTE_HINTS = (
    "tiles too small for tl.dot: 64x64 or larger blocks keep the tensor cores busy",
    "materialized intermediates: a result the next step needs (in attention, the NxN scores) goes through memory "
    "instead of staying on-chip",
    "tl.dot operands in fp32 instead of fp16/bf16, or products accumulated outside tl.dot",
    "no software pipelining (num_stages) or poor L2 reuse (grouped program order)",
)


@dataclass(frozen=True)
class Work:
    """What one call of a benchmark must do: the fewest bytes a fused kernel moves, its useful FLOPs."""

    bytes: float | None
    flops: float | None
    dtype: str | None


_WORK: dict[tuple[int, str], tuple[Part, Work]] = {}
_WORK_LOCK = threading.Lock()  # one count at a time: a caller waits for a count under way instead of redoing it


def benchmark_work(part: Part, bench: Benchmark) -> Work:
    """The benchmark's byte and FLOP counts, computed here from the spec (never taken from a worker);
    remembered per process, since building the inputs takes a while."""
    key = (id(part), bench.label)
    with _WORK_LOCK:
        known = _WORK.get(key)
        if known is None or known[0] is not part:
            inputs = cpu_inputs(part, bench.case)
            work = Work(float(bench.bytes_moved(inputs)) if bench.bytes_moved else None,
                        float(bench.flops(inputs)) if bench.flops else None, bench.case.get("dtype"))
            known = _WORK[key] = (part, work)
        return known[1]


def count_work_in_background(parts: Iterable[Part]) -> threading.Thread:
    """Count the benchmarks' work of ``parts`` in a thread while the worker runs, so that judging the speed
    (after the timed runs) finds the counts ready. Errors are left for :func:`benchmark_work` to raise there."""

    def count() -> None:
        for part in parts:
            for bench in part.benchmarks:
                with contextlib.suppress(Exception):
                    benchmark_work(part, bench)

    thread = threading.Thread(target=count, name="count-benchmark-work", daemon=True)
    thread.start()
    return thread


def load_thresholds(gpu_name: str | None = None) -> Thresholds | None:
    """This GPU's thresholds (``$GRADER_THRESHOLDS`` first); None when it is not calibrated.
    Raises :class:`grader.speed.thresholds.ThresholdsError` for an invalid file."""
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


def resolve_threshold(part: Part, label: str, thresholds: Thresholds | None,
                      curve: thresholds_mod.Curve | None = None) -> tuple[Threshold, str]:
    """The threshold for one benchmark and where it comes from: "calibrated" (this GPU's file),
    "portable" (the most lenient calibrated GPU) or "default"; with the course's ``curve`` applied."""
    exercise = part.exercise.name if part.exercise else "?"
    baseline = part.speed_baseline or "?"
    found: tuple[Threshold, str] | None = None
    if thresholds is not None:
        entry = thresholds.get(exercise, part.name, label)
        if entry is not None and entry.baseline == baseline:
            found = entry, "calibrated"
    if found is None:
        entries, _ = thresholds_mod.portable()
        entry = entries.get((exercise, part.name, label))
        found = (entry, "portable") if entry is not None and entry.baseline == baseline else (
            thresholds_mod.default(baseline), "default")
    return (curve.apply(found[0]) if curve is not None else found[0]), found[1]


def roofline_of(thresholds: Thresholds | None) -> dict[str, Any]:
    """The roofs measured when this GPU was calibrated (by the grader, never by a worker)."""
    if thresholds is None:
        return {}
    return {"copy_gbps": thresholds.copy_gbps, "matmul_tflops": dict(thresholds.matmul_tflops)}


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


def benchmark_credit(row: BenchmarkTiming | None, label: str, work: Work, threshold: Threshold, source: str,
                     roofline: dict[str, Any]) -> dict[str, Any]:
    """One benchmark's numbers and credit, as the reports show them."""
    out: dict[str, Any] = {
        "label": label, "baseline": threshold.baseline, "student_ms": None, "baseline_ms": None, "ratio": None,
        "required_full": threshold.full, "required_partial": threshold.partial, "credit": 0.0,
        "gbps": None, "tflops": None, "pct_roofline": None, "bound": None, "threshold": source,
        "reference_ms": threshold.reference_ms if source == "calibrated" else None, "error": None,
    }
    if row is None:
        out["error"] = "not measured"
        return out
    if row.error:
        out["error"] = row.error
        return out
    student_ms, baseline_ms = row.median(STUDENT), row.median(threshold.baseline)
    if student_ms is None or baseline_ms is None:
        out["error"] = f"no time for {'the student' if student_ms is None else threshold.baseline}"
        return out
    if student_ms <= 0:
        out["error"] = "measured no time at all (the timer saw no work)"
        return out
    ratio = baseline_ms / student_ms
    out.update(student_ms=student_ms, baseline_ms=baseline_ms, ratio=ratio, credit=threshold.credit(ratio),
               spread=row.times[STUDENT].robust_cv, copy_ms=row.median("copy"), mode=row.mode, rounds=row.rounds)
    out.update(roofline_numbers(work.bytes, work.flops, student_ms, work.dtype, roofline))
    return out


def fmt_ms(ms: float | None) -> str:
    if ms is None or not math.isfinite(ms):
        return "?"
    return f"{ms:.3f} ms" if ms >= 0.1 else f"{ms * 1e3:.1f} µs"


def row_message(r: dict[str, Any], roofline: dict[str, Any]) -> str:
    """One benchmark, for a student: measured vs required, ratio, achieved rates, likely causes."""
    label, base = r["label"], r["baseline"]
    if r.get("error"):
        return f"{label}: no speed credit — {r['error']}"
    head = f"{label}: {fmt_ms(r['student_ms'])} = {r['ratio']:.2f}× the speed of {base} ({fmt_ms(r['baseline_ms'])})"
    if r["credit"] >= 1.0:
        return f"{head}; full credit from {r['required_full']:.2f}× — ok"
    need_ms = r["baseline_ms"] / r["required_full"]
    floor_ms = r["baseline_ms"] / r["required_partial"]
    lines = [
        f"{head}; credit {r['credit']:.0%}",
        f"    required: {r['required_full']:.2f}× {base} (≤ {fmt_ms(need_ms)}) for full credit, "
        f"above {r['required_partial']:.2f}× (< {fmt_ms(floor_ms)}) for partial credit",
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
        lines.append(f"    a plain copy of the same data takes {fmt_ms(r['copy_ms'])}")
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
        where = thresholds_mod.display_path(thresholds_mod.path_for(gpu))
    except thresholds_mod.ThresholdsError:
        where = "a thresholds file"
    _, used = thresholds_mod.portable()
    basis = (f"the most lenient ratios of the calibrated GPUs ({', '.join(used)})" if "portable" in sources
             else f"default ratios ({thresholds_mod.DEFAULT_FULL}× {rows[0]['baseline'] if rows else 'baseline'} "
                  "for full credit)")
    missing = "" if thresholds is None else f" ({thresholds.where} has no entry for some benchmarks)"
    return (f"this GPU ({gpu}) is not calibrated{missing}: no {where}; required speeds are {basis}. "
            "Run `grader calibrate` on it to calibrate")


@dataclass
class SpeedCredit:
    fraction: float  # in [0, 1]: the mean credit over the part's benchmarks
    message: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    calibrated: bool = False  # every benchmark scored against this GPU's own thresholds file

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def part_credit(part: Part, measurement: SpeedMeasurement, *, recheck: Verdict,
                thresholds: Thresholds | None, roofline: dict[str, Any] | None = None,
                curve: thresholds_mod.Curve | None = None) -> SpeedCredit:
    """Credit for a part from its measurement and the verdict on its post-timing recheck, on the course's speed
    ``curve`` where it sets one."""
    roofline = roofline_of(thresholds) if roofline is None else roofline
    measured = {b.label: b for b in measurement.benchmarks}
    rows = []
    for bench in part.benchmarks:
        threshold, source = resolve_threshold(part, bench.label, thresholds, curve)
        rows.append(benchmark_credit(measured.get(bench.label), bench.label, benchmark_work(part, bench),
                                     threshold, source, roofline))
    scored = summarize(rows, roofline, measurement.gpu, thresholds, recheck)
    if curve is not None:
        scored.message += f"\nspeed curve (the course file's): {curve.describe(part.speed_baseline or 'the baseline')}"
    return scored


def summarize(rows: list[dict[str, Any]], roofline: dict[str, Any], gpu: str, thresholds: Thresholds | None,
              recheck: Verdict) -> SpeedCredit:
    calibrated = bool(rows) and all(r["threshold"] == "calibrated" for r in rows)
    note = calibration_note(gpu, rows, thresholds)
    if not recheck.passed:
        for r in rows:
            r["credit"] = 0.0
        return SpeedCredit(0.0, f"speed: no credit — {recheck.message}\n{note}", rows, calibrated)
    fraction = statistics.fmean(r["credit"] for r in rows) if rows else 0.0
    full = sum(r["credit"] >= 1.0 for r in rows)
    plural = "s" if len(rows) != 1 else ""
    head = f"speed: {fraction:.0%} ({full} of {len(rows)} benchmark{plural} at full speed) on {gpu}"
    body = "\n".join(row_message(r, roofline) for r in rows)
    return SpeedCredit(fraction, f"{head}\n{body}\n{note}", rows, calibrated)


# --------------------------------------------------------------------------------------------
# Can the measurement be trusted? (the grader's process: plain data in)
# --------------------------------------------------------------------------------------------

DRIFT = 1.5  # a baseline slower or faster than this factor of its calibrated time: the GPU is not as calibrated


def impossible_times(part: Part, measurement: SpeedMeasurement, thresholds: Thresholds | None) -> list[str]:
    """Times that beat the GPU's physical limits (:mod:`grader.speed.limits`): a forged or broken timer."""
    limits = limits_mod.for_gpu(measurement.gpu, thresholds)
    if limits is None:
        return []
    found = []
    benches = {b.label: b for b in part.benchmarks}
    for row in measurement.benchmarks:
        if row.error or row.label not in benches:
            continue
        work = benchmark_work(part, benches[row.label])
        floor = limits_mod.floor_ms(limits, work.bytes, work.flops, work.dtype)
        for name, stats in row.times.items():
            if limits_mod.impossible(stats.median, floor):
                who = "your kernel" if name == STUDENT else f"the baseline {name!r}"
                found.append(f"{row.label}: {who} measured {fmt_ms(stats.median)}, but the work needs at least "
                             f"{fmt_ms(floor)} on {limits.gpu} (its {limits.source} limits: "
                             f"{limits.bandwidth_gbps:.0f} GB/s, {limits.tflops.get(work.dtype or '', 0):.0f} TFLOP/s)")
    return found


def baseline_drift(rows: list[dict[str, Any]], thresholds: Thresholds | None, part: Part) -> str | None:
    """A calibrated baseline measured far from its calibrated time: the GPU is shared, throttled or not the
    one calibrated, so ratios against the thresholds would not be fair (to anyone)."""
    for r in rows:
        if r["threshold"] != "calibrated" or r.get("baseline_ms") is None or thresholds is None:
            continue
        entry = thresholds.get(part.exercise.name if part.exercise else "?", part.name, r["label"])
        if entry is None or not entry.baseline_ms:
            continue
        factor = r["baseline_ms"] / entry.baseline_ms
        if not 1 / DRIFT <= factor <= DRIFT:
            return (f"{r['label']}: the baseline {r['baseline']} took {fmt_ms(r['baseline_ms'])}, "
                    f"{factor:.2f}× its calibrated {fmt_ms(entry.baseline_ms)} on {thresholds.gpu}: this GPU is not "
                    "running as it was calibrated (shared, throttled, or another model)")
    return None
