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

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from grader.checks.spec import Part
from grader.checks.verdicts import Verdict
from grader.speed.credit_messages import SIDE_BY_SIDE, calibration_note, kernel_name, launch_configs, row_message
from grader.speed.measure import REFERENCE, STUDENT, BenchmarkTiming, SpeedMeasurement
from grader.speed.plan import LaunchPlan
from grader.speed.stats import RatioInterval
from grader.speed.thresholds import calibrated, gpu_files, speed_curves
from grader.speed.thresholds.calibrated import Threshold, Thresholds
from grader.speed.trust_checks import baseline_drift, distrust, unfair_gpu
from grader.speed.trusted import REPLAY_MISMATCH
from grader.speed.workload import Work, benchmark_work, roofline_numbers, roofline_of

# A part's speed status, as results and reports carry it.
MEASURED = "measured"  # credit from trusted times
NOT_MEASURED = "not measured"  # no times: not implemented, not submitted, no GPU, ...
NOT_GRADED = "not graded"  # the part is not speed-graded
FAILED = "failed"  # the measurement failed (the student's code raised, a benchmark errored): no credit
FLAGGED = "flagged"  # the measurement cannot be trusted: no credit, an integrity flag
NEEDS_REGRADE = "needs regrade"  # this GPU cannot grade speed now (not calibrated, not running as calibrated)

def load_thresholds(gpu_name: str | None = None) -> Thresholds | None:
    """This GPU's thresholds (``$GRADER_THRESHOLDS`` first); None when it is not calibrated.
    Raises :class:`~grader.speed.thresholds.calibrated.ThresholdsError` for an invalid file."""
    if gpu_name is None:
        if not torch.cuda.is_available():
            return None
        gpu_name = torch.cuda.get_device_name()
    return gpu_files.find(gpu_name)


def thresholds_summary(gpu_name: str | None = None) -> str:
    """One line for the pytest header: which thresholds the speed tests use on this GPU."""
    try:
        gpu_name = gpu_name or torch.cuda.get_device_name()
        found = load_thresholds(gpu_name)
    except calibrated.ThresholdsError as exc:
        return f"speed thresholds: {exc}"
    if found is None:
        return (f"speed thresholds: this GPU ({gpu_name}) is not calibrated — speed tests use the calibrated GPUs' "
                "ratios (`grader calibrate` makes its file)")
    return f"speed thresholds: {found.where} (calibrated on {found.gpu})"


def resolve_threshold(part: Part, label: str, thresholds: Thresholds | None,
                      curve: speed_curves.Curve | None = None) -> tuple[Threshold, str]:
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
        entries, _ = gpu_files.portable()
        entry = entries.get((exercise, part.name, label))
        found = (entry, "portable") if entry is not None and entry.baseline == baseline else (
            gpu_files.default(baseline), "default")
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
    # each kernel the call launched with its constexprs, warps and stages (credit_messages.launch_configs): the
    # student's, and the reference solution's where it was timed beside them (its autotuners' choices on this GPU)
    configs: list[str] | None = None
    reference_configs: list[str] | None = None

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
    return Threshold(baseline, reference_ms, baseline_ms, full=speed_curves.FULL_FRACTION * rr,
                     partial=speed_curves.PARTIAL_FRACTION * rr, reference_ratio=rr)


def _beside(out: BenchmarkCredit, interval: RatioInterval, threshold: Threshold) -> None:
    """Credit from the paired ratio to the reference (its point estimate), the fractions it is judged against, and
    whether its interval still straddles one of them."""
    rr = threshold.reference_ratio or 1.0
    out.yardstick, out.yardstick_low, out.yardstick_high = interval.point, interval.low, interval.high
    out.yardstick_full, out.yardstick_partial = threshold.full / rr, threshold.partial / rr
    out.credit = threshold.credit(interval.point * rr)
    out.straddles = not interval.clear_of((out.yardstick_full, out.yardstick_partial))


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
                curve: speed_curves.Curve | None = None, labels: Iterable[str] | None = None) -> SpeedCredit:
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
            row.launches = [kernel_name(plan, step.kernel) for step in plan.steps if step.op == "launch"]
            row.reference_launches = part.reference_launches
            row.configs = launch_configs(plan)
        row.reference_configs = measurement.reference_configs.get(bench.label)
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


def judge(part: Part, measurement: SpeedMeasurement, *, recheck: Verdict, thresholds: Thresholds | None,
          curve: speed_curves.Curve | None = None, labels: Iterable[str] | None = None,
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
