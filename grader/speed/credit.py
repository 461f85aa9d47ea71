"""The speed-credit rule, in one place: :func:`judge` turns a :class:`~grader.speed.measure.SpeedMeasurement` into
a :class:`SpeedVerdict` — whether the measurement can be trusted (timing primitives replaced, replays that did not
compute the function, times beyond the GPU's physical limits), the credit per benchmark (typed rows,
:class:`BenchmarkCredit`), and whether this GPU can grade speed at all (calibrated, running as calibrated). The
grader's judging, ``pytest -m speed`` and ``grader bench`` all call it. Plain data in, never student code: the
grader runs this in its verdict process.

Ratios are ``baseline_ms / student_ms`` — the student's speed in units of the baseline measured in the
same run — and credit is linear between the thresholds' ``partial`` and ``full`` ratios
(:mod:`grader.speed.thresholds`). The messages give the measured and required times, the ratio, the
achieved bandwidth and throughput against this GPU's roofline, and what usually causes a gap.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from grader.checks.spec import Part
from grader.checks.verdicts import Verdict
from grader.speed import gpu_limits
from grader.speed import thresholds as thresholds_mod
from grader.speed.measure import REFERENCE, STUDENT, BenchmarkTiming, SpeedMeasurement
from grader.speed.plan import LaunchPlan
from grader.speed.stats import RatioInterval
from grader.speed.thresholds import Threshold, Thresholds
from grader.speed.trusted import REPLAY_MISMATCH
from grader.speed.workload import Work, benchmark_work, roofline_numbers, roofline_of

# A part's speed status, as results and reports carry it.
MEASURED = "measured"  # credit from trusted times
NOT_MEASURED = "not measured"  # no times: not implemented, not submitted, no GPU, ...
NOT_GRADED = "not graded"  # the part is not speed-graded
FAILED = "failed"  # the measurement failed (the student's code raised, a benchmark errored): no credit
FLAGGED = "flagged"  # the measurement cannot be trusted: no credit, an integrity flag
NEEDS_REGRADE = "needs regrade"  # this GPU cannot grade speed now (not calibrated, not running as calibrated)

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


@dataclass
class BenchmarkCredit:
    """One benchmark's numbers and credit, as the reports show them."""

    label: str
    baseline: str
    student_ms: float | None = None
    baseline_ms: float | None = None
    ratio: float | None = None  # baseline_ms / student_ms: the student's speed in units of the baseline
    required_full: float = 0.0
    required_partial: float = 0.0
    credit: float = 0.0
    gbps: float | None = None
    tflops: float | None = None
    pct_roofline: float | None = None
    bound: str | None = None  # "memory" | "compute"
    # where the thresholds come from: "side by side" (the reference timed in the same rounds) | "calibrated" |
    # "portable" | "default"
    threshold: str = "default"
    reference_ms: float | None = None  # the reference solution's time: in the same rounds, else calibrated
    # side by side: reference_ms / student_ms from the paired rounds, its interval, and the fractions of it for full
    # and for partial credit; ``straddles``: the interval still held a boundary when the budget ran out
    yardstick: float | None = None
    yardstick_low: float | None = None
    yardstick_high: float | None = None
    yardstick_full: float | None = None
    yardstick_partial: float | None = None
    straddles: bool = False
    error: str | None = None  # why there is no ratio
    # measured rows only:
    spread: float | None = None  # the student's robust coefficient of variation
    copy_ms: float | None = None  # a device copy of the same data
    mode: str | None = None  # "event" | "graph"
    rounds: int | None = None
    launches: list[str] | None = None  # the kernels one call of the student's launched, in order (the grader's)
    reference_launches: int | None = None  # the kernels one call of the reference solution launches

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.ratio is None:  # a row without a measurement carries no measurement details
            for key in _MEASURED_ONLY:
                del data[key]
        if self.launches is None:  # pytest and grader bench record none
            del data["launches"]
            del data["reference_launches"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchmarkCredit:
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})


_MEASURED_ONLY = ("spread", "copy_ms", "mode", "rounds")
SIDE_BY_SIDE = "side by side"
_FIELDS = {f.name for f in fields(BenchmarkCredit)}


def benchmark_credit(row: BenchmarkTiming | None, label: str, work: Work, threshold: Threshold, source: str,
                     roofline: dict[str, Any]) -> BenchmarkCredit:
    """One benchmark's numbers and credit."""
    out = BenchmarkCredit(label, threshold.baseline, required_full=threshold.full,
                          required_partial=threshold.partial, threshold=source,
                          reference_ms=threshold.reference_ms if source in ("calibrated", SIDE_BY_SIDE) else None)
    if row is None:
        out.error = "not measured"
        return out
    if row.error:
        out.error = row.error
        return out
    student_ms, baseline_ms = row.median(STUDENT), row.median(threshold.baseline)
    if student_ms is None or baseline_ms is None:
        out.error = f"no time for {'the student' if student_ms is None else threshold.baseline}"
        return out
    if student_ms <= 0:
        out.error = "measured no time at all (the timer saw no work)"
        return out
    ratio = baseline_ms / student_ms
    out.student_ms, out.baseline_ms, out.ratio, out.credit = student_ms, baseline_ms, ratio, threshold.credit(ratio)
    if source == SIDE_BY_SIDE and row.yardstick and threshold.reference_ratio:
        _beside(out, RatioInterval.from_dict(row.yardstick), threshold)
    out.spread, out.copy_ms = row.times[STUDENT].robust_cv, row.median("copy")
    out.mode, out.rounds = row.mode, row.rounds
    rates = roofline_numbers(work.bytes, work.flops, student_ms, work.dtype, roofline)
    out.gbps, out.tflops, out.pct_roofline, out.bound = (rates["gbps"], rates["tflops"], rates["pct_roofline"],
                                                         rates["bound"])
    return out


def side_by_side(row: BenchmarkTiming | None, baseline: str) -> Threshold | None:
    """The threshold of a benchmark timed beside the reference (the yardstick): the course's fractions of the
    reference's speed measured in the same rounds, in units of the baseline (None where it was not)."""
    if row is None or row.error or not row.yardstick:
        return None
    reference_ms, baseline_ms = row.median(REFERENCE), row.median(baseline)
    if not reference_ms or not baseline_ms:
        return None
    rr = baseline_ms / reference_ms
    return Threshold(baseline, reference_ms, baseline_ms, full=thresholds_mod.FULL_FRACTION * rr,
                     partial=thresholds_mod.PARTIAL_FRACTION * rr, reference_ratio=rr)


def _beside(out: BenchmarkCredit, interval: RatioInterval, threshold: Threshold) -> None:
    """Credit from the paired ratio to the reference (its point estimate), the fractions it is judged against, and
    whether its interval still straddles one of them."""
    rr = threshold.reference_ratio or 1.0
    out.yardstick, out.yardstick_low, out.yardstick_high = interval.point, interval.low, interval.high
    out.yardstick_full, out.yardstick_partial = threshold.full / rr, threshold.partial / rr
    out.credit = threshold.credit(interval.point * rr)
    out.straddles = not interval.clear_of((out.yardstick_full, out.yardstick_partial))


def fmt_ms(ms: float | None) -> str:
    if ms is None or not math.isfinite(ms):
        return "?"
    return f"{ms:.3f} ms" if ms >= 0.1 else f"{ms * 1e3:.1f} µs"


def row_message(r: BenchmarkCredit, roofline: dict[str, Any]) -> str:
    """One benchmark, for a student: measured vs required, ratio, achieved rates, likely causes."""
    label, base = r.label, r.baseline
    if r.error:
        return f"{label}: no speed credit — {r.error}"
    if r.yardstick is not None and r.yardstick_full and r.yardstick_partial is not None and r.reference_ms:
        head = (f"{label}: {fmt_ms(r.student_ms)} = {r.yardstick:.2f}× the speed of the reference solution "
                f"({fmt_ms(r.reference_ms)}, timed in the same rounds; {r.yardstick_low:.2f}–{r.yardstick_high:.2f}), "
                f"{r.ratio:.2f}× {base} ({fmt_ms(r.baseline_ms)})")
        straddle = ("\n    the interval still holds a credit boundary after the part's timing budget: credited at "
                    "the point estimate" if r.straddles else "")
        if r.credit >= 1.0:
            return f"{head}; full credit from {r.yardstick_full:.2f}× the reference — ok{straddle}"
        lines = [f"{head}; credit {r.credit:.0%}{straddle}",
                 f"    required: {r.yardstick_full:.2f}× the reference's speed (≤ "
                 f"{fmt_ms(r.reference_ms / r.yardstick_full)}) for full credit, above {r.yardstick_partial:.2f}×"
                 + (f" (< {fmt_ms(r.reference_ms / r.yardstick_partial)})" if r.yardstick_partial > 0 else "")
                 + " for partial credit"]
    else:
        head = f"{label}: {fmt_ms(r.student_ms)} = {r.ratio:.2f}× the speed of {base} ({fmt_ms(r.baseline_ms)})"
        if r.credit >= 1.0:
            return f"{head}; full credit from {r.required_full:.2f}× — ok"
        need_ms = r.baseline_ms / r.required_full
        floor = f" (< {fmt_ms(r.baseline_ms / r.required_partial)})" if r.required_partial > 0 else ""
        lines = [
            f"{head}; credit {r.credit:.0%}",
            f"    required: {r.required_full:.2f}× {base} (≤ {fmt_ms(need_ms)}) for full credit, "
            f"above {r.required_partial:.2f}×{floor} for partial credit",
        ]
    achieved = []
    if r.gbps is not None:
        bw = roofline.get("copy_gbps")
        of = f" = {100 * r.gbps / bw:.0f}% of the copy bandwidth ({bw:.0f} GB/s measured)" if bw else ""
        achieved.append(f"{r.gbps:.0f} GB/s{of}")
    if r.tflops is not None:
        achieved.append(f"{r.tflops:.2f} TFLOP/s")
    if r.pct_roofline is not None:
        achieved.append(f"{r.pct_roofline:.0f}% of the roofline")
    if achieved:
        lines.append("    achieved: " + "; ".join(achieved))
    if r.copy_ms:
        lines.append(f"    a plain copy of the same data takes {fmt_ms(r.copy_ms)}")
    if r.launches:
        beside = f", the reference solution's {r.reference_launches}" if r.reference_launches is not None else ""
        lines.append(f"    your call launches {launch_list(r.launches)}{beside}: each launch is a pass over its "
                     "memory; `grader profile` shows them beside the reference's")
    hints = COMPUTE_HINTS if r.bound == "compute" else MEMORY_HINTS
    kind = "compute-bound" if r.bound == "compute" else "memory-bound"
    lines.append(f"    what usually causes the gap ({kind} kernel):")
    lines += [f"      - {h}" for h in hints]
    return "\n".join(lines)


def launch_list(names: list[str], most: int = 6) -> str:
    """``3 kernels (_row ×2, _sum)``: the count, then each kernel with how often it ran, in first-launch order."""
    counts = dict.fromkeys(names, 0)
    for name in names:
        counts[name] += 1
    each = [name if n == 1 else f"{name} ×{n}" for name, n in counts.items()]
    shown = ", ".join(each[:most]) + (f", and {len(each) - most} more" if len(each) > most else "")
    return f"{len(names)} kernel{'s' if len(names) != 1 else ''} ({shown})"


def _kernel_name(plan: LaunchPlan, index: int) -> str:
    """A recorded kernel's name as a report may show it (the plan comes from the student's process: only an
    identifier's characters, at most 60)."""
    name = plan.kernels[index].name if 0 <= index < len(plan.kernels) else "?"
    return "".join(c for c in name if c.isalnum() or c in "_.")[:60] or "?"


def calibration_note(gpu: str, rows: list[BenchmarkCredit], thresholds: Thresholds | None) -> str:
    sources = {r.threshold for r in rows}
    if sources == {SIDE_BY_SIDE}:
        return ("yardstick: the reference solution's kernels, replayed and timed in the same rounds as yours on this "
                f"GPU ({gpu})")
    sources.discard(SIDE_BY_SIDE)
    if sources == {"calibrated"} and thresholds is not None:
        return f"thresholds: {thresholds.where} (calibrated on {thresholds.gpu})"
    try:
        where = thresholds_mod.display_path(thresholds_mod.path_for(gpu))
    except thresholds_mod.ThresholdsError:
        where = "a thresholds file"
    _, used = thresholds_mod.portable()
    basis = (f"the most lenient ratios of the calibrated GPUs ({', '.join(used)})" if "portable" in sources
             else f"default ratios ({thresholds_mod.DEFAULT_FULL}× {rows[0].baseline if rows else 'baseline'} "
                  "for full credit)")
    missing = "" if thresholds is None else f" ({thresholds.where} has no entry for some benchmarks)"
    return (f"this GPU ({gpu}) is not calibrated{missing}: no {where}; required speeds are {basis}. "
            "Run `grader calibrate` on it to calibrate")


@dataclass
class SpeedCredit:
    fraction: float  # in [0, 1]: the mean credit over the part's benchmarks
    message: str
    rows: list[BenchmarkCredit] = field(default_factory=list)
    calibrated: bool = False  # every benchmark scored against this GPU's own thresholds file

    def to_dict(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "message": self.message, "rows": [r.to_dict() for r in self.rows],
                "calibrated": self.calibrated}


def part_credit(part: Part, measurement: SpeedMeasurement, *, recheck: Verdict,
                thresholds: Thresholds | None, roofline: dict[str, Any] | None = None,
                curve: thresholds_mod.Curve | None = None, labels: Iterable[str] | None = None) -> SpeedCredit:
    """Credit for a part (its benchmarks ``labels``, default all) from its measurement and the verdict on its
    post-timing recheck, on the course's speed ``curve`` where it sets one."""
    roofline = roofline_of(thresholds) if roofline is None else roofline
    measured = {b.label: b for b in measurement.benchmarks}
    wanted = None if labels is None else set(labels)
    rows = []
    for bench in part.benchmarks:
        if wanted is not None and bench.label not in wanted:
            continue
        beside = side_by_side(measured.get(bench.label), part.speed_baseline or "?")
        if beside is not None:
            threshold, source = (curve.apply(beside) if curve is not None else beside), SIDE_BY_SIDE
        else:
            threshold, source = resolve_threshold(part, bench.label, thresholds, curve)
        row = benchmark_credit(measured.get(bench.label), bench.label, benchmark_work(part, bench), threshold,
                               source, roofline)
        plan = measurement.plans.get(bench.label)
        if isinstance(plan, LaunchPlan):  # recorded in the worker: what the call launched, kernel by kernel
            row.launches = [_kernel_name(plan, step.kernel) for step in plan.steps if step.op == "launch"]
            row.reference_launches = part.reference_launches
        rows.append(row)
    scored = summarize(rows, roofline, measurement.gpu, thresholds, recheck)
    if curve is not None:
        scored.message += f"\nspeed curve (the course file's): {curve.describe(part.speed_baseline or 'the baseline')}"
    return scored


def summarize(rows: list[BenchmarkCredit], roofline: dict[str, Any], gpu: str, thresholds: Thresholds | None,
              recheck: Verdict) -> SpeedCredit:
    calibrated = bool(rows) and all(r.threshold in ("calibrated", SIDE_BY_SIDE) for r in rows)
    note = calibration_note(gpu, rows, thresholds)
    if not recheck.passed:
        for r in rows:
            r.credit = 0.0
        return SpeedCredit(0.0, f"speed: no credit — {recheck.message}\n{note}", rows, calibrated)
    fraction = statistics.fmean(r.credit for r in rows) if rows else 0.0
    full = sum(r.credit >= 1.0 for r in rows)
    plural = "s" if len(rows) != 1 else ""
    head = f"speed: {fraction:.0%} ({full} of {len(rows)} benchmark{plural} at full speed) on {gpu}"
    body = "\n".join(row_message(r, roofline) for r in rows)
    return SpeedCredit(fraction, f"{head}\n{body}\n{note}", rows, calibrated)


# --------------------------------------------------------------------------------------------
# Can the measurement be trusted? (the grader's process: plain data in)
# --------------------------------------------------------------------------------------------

DRIFT = 1.5  # a baseline slower or faster than this factor of its calibrated time: the GPU is not as calibrated
# The reference's own median moving by more than this between the first and the second half of its rounds: the GPU
# changed while it timed (the paired ratio absorbs slow drift; this much is a GPU nobody should grade on).
YARDSTICK_DRIFT = 0.10


def unfair_gpu(measurement: SpeedMeasurement) -> str | None:
    """Why the GPU's state made the timed rounds unfair (the grader's side: a regrade, never a lower score): a
    throttle seen before or after them, or a yardstick whose own time moved during them."""
    from grader.speed import gpu_state

    states = [gpu_state.GpuState.from_dict(d) for d in measurement.gpu_state if d]
    throttled = gpu_state.throttled(states)
    if throttled:
        return f"the GPU throttled while the part was timed ({throttled})"
    for row in measurement.benchmarks:
        if row.yardstick_drift is not None and row.yardstick_drift > YARDSTICK_DRIFT:
            return (f"{row.label}: the reference solution's own time moved by {row.yardstick_drift:.0%} during the "
                    f"rounds (more than {YARDSTICK_DRIFT:.0%}): the GPU changed while it was timed")
    return None


def impossible_times(part: Part, measurement: SpeedMeasurement, thresholds: Thresholds | None) -> list[str]:
    """Times that beat the GPU's physical limits (:mod:`grader.speed.gpu_limits`): a forged or broken timer."""
    limits = gpu_limits.for_gpu(measurement.gpu, thresholds)
    if limits is None:
        return []
    found = []
    benches = {b.label: b for b in part.benchmarks}
    for row in measurement.benchmarks:
        if row.error or row.label not in benches:
            continue
        work = benchmark_work(part, benches[row.label])
        floor = gpu_limits.floor_ms(limits, work.bytes, work.flops, work.dtype)
        for name, stats in row.times.items():
            if gpu_limits.impossible(stats.median, floor):
                who = "your kernel" if name == STUDENT else f"the baseline {name!r}"
                found.append(f"{row.label}: {who} measured {fmt_ms(stats.median)}, but the work needs at least "
                             f"{fmt_ms(floor)} on {limits.gpu} (its {limits.source} limits: "
                             f"{limits.bandwidth_gbps:.0f} GB/s, {limits.tflops.get(work.dtype or '', 0):.0f} TFLOP/s)")
    return found


def baseline_drift(rows: list[BenchmarkCredit], thresholds: Thresholds | None, part: Part) -> str | None:
    """A calibrated baseline measured far from its calibrated time: the GPU is shared, throttled or not the
    one calibrated, so ratios against the thresholds would not be fair (to anyone)."""
    for r in rows:
        if r.threshold != "calibrated" or r.baseline_ms is None or thresholds is None:
            continue
        entry = thresholds.get(part.exercise.name if part.exercise else "?", part.name, r.label)
        if entry is None or not entry.baseline_ms:
            continue
        factor = r.baseline_ms / entry.baseline_ms
        if not 1 / DRIFT <= factor <= DRIFT:
            return (f"{r.label}: the baseline {r.baseline} took {fmt_ms(r.baseline_ms)}, "
                    f"{factor:.2f}× its calibrated {fmt_ms(entry.baseline_ms)} on {thresholds.gpu}: this GPU is not "
                    "running as it was calibrated (shared, throttled, or another model)")
    return None


# --------------------------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------------------------


@dataclass
class SpeedVerdict:
    """What :func:`judge` says about a part's speed: its status (the constants above), the credit where there is
    one, the rows, and the integrity flags to raise (``(rule, message)``, scope speed)."""

    status: str
    message: str
    fraction: float | None = None
    rows: list[BenchmarkCredit] = field(default_factory=list)
    calibrated: bool = False
    roofline: dict[str, Any] = field(default_factory=dict)
    flags: list[tuple[str, str]] = field(default_factory=list)


def distrust(part: Part, measurement: SpeedMeasurement, thresholds: Thresholds | None) -> list[tuple[str, str]]:
    """Why the measurement cannot be trusted, as integrity flags ``(rule, message)``; empty when it can."""
    flags = []
    if measurement.tampered:
        flags.append(("timer-tampering", "the timing primitives were replaced while the student's code ran: "
                      + ", ".join(measurement.tampered[:8])))
    if measurement.mismatches:
        flags.append((REPLAY_MISMATCH, "the student's kernels, replayed by the grader's timer, did not compute the "
                      "function: " + "; ".join(measurement.mismatches[:3])))
    impossible = impossible_times(part, measurement, thresholds)
    if impossible:
        flags.append(("impossible-speed", "times faster than the GPU can physically go:\n  " + "\n  ".join(impossible)))
    return flags


def judge(part: Part, measurement: SpeedMeasurement, *, recheck: Verdict, thresholds: Thresholds | None,
          curve: thresholds_mod.Curve | None = None, labels: Iterable[str] | None = None,
          roofline: dict[str, Any] | None = None, require_calibration: bool = True) -> SpeedVerdict:
    """The speed verdict on a part (its benchmarks ``labels``, default all): no credit and flags where the
    measurement cannot be trusted; else the credit against ``thresholds`` on the course's ``curve``. With
    ``require_calibration`` (the grader), a GPU without its own calibrated thresholds, or one whose baselines run
    far from their calibrated times, grades no speed (:data:`NEEDS_REGRADE`); ``pytest`` and ``grader bench``
    show the credit against the calibrated GPUs' ratios instead. ``roofline``: the roofs to rate against
    (default: those measured when the GPU was calibrated)."""
    flags = distrust(part, measurement, thresholds)
    if not recheck.passed:  # the student's own call is wrong too: a wrong result (no credit below), not a forgery
        flags = [(rule, message) for rule, message in flags if rule != REPLAY_MISMATCH]
    if flags:
        return SpeedVerdict(FLAGGED, "speed: no credit — the measurement cannot be trusted: "
                            + "; ".join(message for _, message in flags), 0.0, flags=flags)
    scored = part_credit(part, measurement, recheck=recheck, thresholds=thresholds, roofline=roofline, curve=curve,
                         labels=labels)
    if require_calibration and not scored.calibrated:
        return SpeedVerdict(NEEDS_REGRADE, f"speed: not graded on this GPU ({measurement.gpu}): the reference "
                            "solution was not timed beside it and the GPU has no calibrated thresholds; correctness is "
                            f"graded, speed waits for a regrade\n{scored.message}", rows=scored.rows)
    unfair = unfair_gpu(measurement) if require_calibration else None
    if unfair is not None:
        return SpeedVerdict(NEEDS_REGRADE, f"speed: not graded in this run: {unfair}; it waits for a regrade\n"
                            f"{scored.message}", rows=scored.rows, calibrated=True)
    drift = baseline_drift(scored.rows, thresholds, part) if require_calibration else None
    if drift is not None:
        return SpeedVerdict(NEEDS_REGRADE, f"speed: not graded in this run: {drift}; it waits for a regrade\n"
                            f"{scored.message}", rows=scored.rows, calibrated=True)
    return SpeedVerdict(FAILED if measurement.error else MEASURED, scored.message, scored.fraction, scored.rows,
                        scored.calibrated, roofline_of(thresholds))
