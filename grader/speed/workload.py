"""What a benchmark must do, counted from the spec in the grader's process (never taken from a worker): the fewest
bytes a fused kernel moves and its useful FLOPs (:class:`Work`), and the rates a time achieves against the GPU's
measured roofs (:func:`roofline_numbers`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from grader.checks import tensors
from grader.checks.spec import Benchmark, Inputs, Part
from grader.speed.measure import cpu_inputs
from grader.speed.thresholds.calibrated import Thresholds


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
    remembered per process."""
    key = (id(part), bench.label)
    with _WORK_LOCK:
        known = _WORK.get(key)
        if known is None or known[0] is not part:
            known = _WORK[key] = (part, _count(part, bench))
        return known[1]


def _count(part: Part, bench: Benchmark) -> Work:
    """Counted on inputs without values (the meta device: shapes, dtypes and strides are what the counts read),
    else on the CPU's inputs, which take seconds to draw at benchmark size."""
    try:
        with tensors.generated_on("meta"):
            inputs = part.make_inputs(bench.case)
            return _work(bench, inputs)
    except Exception:  # inputs whose building reads values: drawn for real
        return _work(bench, cpu_inputs(part, bench.case))


def _work(bench: Benchmark, inputs: Inputs) -> Work:
    return Work(float(bench.bytes_moved(inputs)) if bench.bytes_moved else None,
                float(bench.flops(inputs)) if bench.flops else None, bench.case.get("dtype"))


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
