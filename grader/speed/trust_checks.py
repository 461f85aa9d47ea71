"""Whether a speed measurement can grade speed at all: integrity flags where it cannot be trusted (timing primitives
replaced, replays that did not compute the function, times beyond the GPU's physical limits), and the grader's side
where the GPU was not fair while it timed (a throttle, a yardstick that moved, baselines far from their calibration),
which waits for a regrade instead of costing the student. Plain data in: the grader runs this in its own process."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grader.checks.spec import Part
from grader.speed import gpu_limits
from grader.speed.credit_messages import fmt_ms
from grader.speed.measure import STUDENT, SpeedMeasurement
from grader.speed.thresholds.calibrated import Thresholds
from grader.speed.trusted import REPLAY_MISMATCH
from grader.speed.workload import benchmark_work

if TYPE_CHECKING:
    from grader.speed.credit import BenchmarkCredit

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
