"""Cheating: the 2x-slow GeLU plus the worker's reply edited after the measurement, where it is turned into the
message the grader reads: every benchmark row gets fast student times, and every recorded launch covers half
the grid (half the work, so the replayed kernels would be twice as fast)."""

import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = x / (1.0 + tl.exp(-1.5957691216057308 * (x + 0.044715 * x * x * x)))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(xc, y, n_elements):
    _gelu_kernel[(triton.cdiv(max(n_elements, 1), 1024),)](xc, y, n_elements, BLOCK=1024)


def gelu(x):
    """Right, and twice as slow as it needs to be: the kernel runs twice over the whole tensor."""
    xc = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    for _ in range(2):
        _launch(xc, y, xc.numel())
    return y


_protocol = sys.modules.get("grader.grading.protocol")
if _protocol is not None:
    _encode = _protocol.encode

    def _forged(message):
        data = _encode(message)
        if data.get("type") == "speed_done":
            for row in data["benchmarks"]:
                for stats in row.get("times", {}).values():
                    for key in ("median", "mean", "min", "max", "q1", "q3"):
                        stats[key] = stats[key] / 2
            for plan in data.get("plans", {}).values():
                for step in plan.get("steps", []):
                    if step.get("op") == "launch":
                        step["grid"][0] = max(1, step["grid"][0] // 2)
        return data

    _protocol.encode = _forged
