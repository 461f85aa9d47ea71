"""Cheating: the 2x-slow GeLU plus, at import, the grader's own measurement wrapped from ``sys.modules``: every
benchmark the grader's speed module measures comes back with the student's times halved (never the baselines'),
and the timing primitives' tamper check reports nothing."""

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


def _halve_student(row):
    for name, stats in list(getattr(row, "times", {}).items()):
        if name == "student":
            row.times[name] = type(stats)(*(v / 2 if isinstance(v, float) else v for v in stats.to_dict().values()))
    return row


_measure = sys.modules.get("grader.speed.measure")
_timing = sys.modules.get("grader.speed.timing")
if _measure is not None:
    _original = _measure.measure_benchmark
    _measure.measure_benchmark = lambda *args, **kwargs: _halve_student(_original(*args, **kwargs))
if _timing is not None:
    _timing.tampered = lambda: []
