"""The words of a speed verdict: a benchmark's line for the student (measured against required, the ratio, the achieved
rates against the roofline, and what usually causes a gap), the kernels a call launched, and where the required
speeds came from. Plain data in (:class:`grader.speed.credit.BenchmarkCredit` rows)."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from grader.speed.plan import LaunchPlan
from grader.speed.thresholds import calibrated, gpu_files
from grader.speed.thresholds.calibrated import Thresholds

if TYPE_CHECKING:
    from grader.speed.credit import BenchmarkCredit

SIDE_BY_SIDE = "side by side"  # a row's threshold source: the reference solution timed in the same rounds

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


def kernel_name(plan: LaunchPlan, index: int) -> str:
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
        where = calibrated.display_path(gpu_files.path_for(gpu))
    except calibrated.ThresholdsError:
        where = "a thresholds file"
    _, used = gpu_files.portable()
    basis = (f"the most lenient ratios of the calibrated GPUs ({', '.join(used)})" if "portable" in sources
             else f"default ratios ({gpu_files.DEFAULT_FULL}× {rows[0].baseline if rows else 'baseline'} "
                  "for full credit)")
    missing = "" if thresholds is None else f" ({thresholds.where} has no entry for some benchmarks)"
    return (f"this GPU ({gpu}) is not calibrated{missing}: no {where}; required speeds are {basis}. "
            "Run `grader calibrate` on it to calibrate")


MAX_CONFIGS = 8  # distinct launches listed per call


def launch_configs(plan: LaunchPlan) -> list[str]:
    """Each distinct kernel launch of ``plan`` with its config: ``_fwd_kernel: BLOCK_M=128, BLOCK_N=64, num_warps=8,
    num_stages=3``. The constexprs are the launch's own (an autotuner's choice shows here); warps and stages come from
    the compiled kernel's metadata. The plan may come from a student's process: only identifiers and numbers are
    kept, each line at most 200 characters."""
    seen: list[str] = []
    for step in plan.steps:
        if step.op != "launch" or not 0 <= step.kernel < len(plan.kernels):
            continue
        kernel = plan.kernels[step.kernel]
        pieces = [f"{_word(name)}={_value(arg.value)}" for name, arg in zip(kernel.signature, step.args)
                  if arg.kind == "constexpr" and _word(name)]
        try:
            meta = json.loads(kernel.metadata_json)
        except ValueError:
            meta = {}
        for key in ("num_warps", "num_stages", "num_ctas"):
            if isinstance(meta, dict) and isinstance(meta.get(key), int) and not (key == "num_ctas" and meta[key] == 1):
                pieces.append(f"{key}={meta[key]}")
        line = f"{kernel_name(plan, step.kernel)}: {', '.join(pieces) or 'no constexprs'}"[:200]
        if line not in seen:
            seen.append(line)
    return seen[:MAX_CONFIGS]


def _word(name: str) -> str:
    return "".join(c for c in str(name) if c.isalnum() or c == "_")[:40]


def _value(value: object) -> str:
    if isinstance(value, bool | int | float) or value is None:
        return str(value)[:20]
    return _word(str(value)) or "?"
