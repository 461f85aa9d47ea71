"""What a GPU cannot do: move bytes faster than its memory bandwidth, or compute faster than its peak.

A measured time that would need either is not a fast kernel but a forged or broken measurement; the
grader (in its own process, never the worker's) gives it no speed credit and flags it. The limits come
from NVIDIA's datasheets (dense math, no sparsity) for the GPUs listed, else from the roofs that
``grader calibrate`` measured on that GPU, with room to spare; a GPU with neither is not checked.

The check is deliberately loose (:data:`MARGIN`): it exists to catch times that are impossible by a wide
margin (a timer that reads 1e-6 ms), never to second-guess a kernel that is merely excellent. The bytes
are the fewest a fused kernel must move and the L2 cache is flushed before every timed call; writes still
in the L2 when the end event fires are the reason for the margin on bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from grader.speed.thresholds import calibrated

MARGIN = 1.5  # impossible: the work would need more than MARGIN × the limit

# slug -> (memory bandwidth GB/s, dense tensor TFLOP/s per dtype; float32 is TF32, as tl.dot uses)
DATASHEETS: dict[str, tuple[float, dict[str, float]]] = {
    "h100": (3350.0, {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7}),
    "h100-pcie": (2000.0, {"bfloat16": 756.0, "float16": 756.0, "float32": 378.0}),
    "h100-nvl": (3900.0, {"bfloat16": 835.0, "float16": 835.0, "float32": 417.5}),
    "h200": (4800.0, {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7}),
    "a100": (2039.0, {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0}),
    "a100-pcie": (1935.0, {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0}),
}
CALIBRATION_ROOM = 1.25  # measured roofs are below the peaks: allow this much above them


@dataclass(frozen=True)
class Limits:
    gpu: str
    bandwidth_gbps: float
    tflops: Mapping[str, float]
    source: str  # "datasheet" or "calibration"


def for_gpu(gpu_name: str, thresholds: calibrated.Thresholds | None) -> Limits | None:
    try:
        slug = calibrated.slug(gpu_name)
    except calibrated.ThresholdsError:
        slug = ""
    if slug in DATASHEETS:
        bandwidth, tflops = DATASHEETS[slug]
        return Limits(gpu_name, bandwidth, tflops, "datasheet")
    if thresholds is not None and thresholds.copy_gbps:
        return Limits(gpu_name, thresholds.copy_gbps * CALIBRATION_ROOM,
                      {d: v * CALIBRATION_ROOM for d, v in thresholds.matmul_tflops.items()}, "calibration")
    return None


def floor_ms(limits: Limits, nbytes: float | None, flops: float | None, dtype: str | None) -> float | None:
    """The least time the work can take on this GPU (None where nothing is known about it)."""
    bounds = []
    if nbytes:
        bounds.append(nbytes / (limits.bandwidth_gbps * 1e9) * 1e3)
    peak = limits.tflops.get(dtype or "")
    if flops and peak:
        bounds.append(flops / (peak * 1e12) * 1e3)
    return max(bounds) if bounds else None


def impossible(ms: float, floor: float | None) -> bool:
    return floor is not None and ms * MARGIN < floor
