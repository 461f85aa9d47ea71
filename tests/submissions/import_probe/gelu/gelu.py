"""Correct, but looks around first: can it import the solutions, what is on its path, where does it run?"""
import os
import sys

import torch
import triton
import triton.language as tl

try:
    import solutions  # noqa: F401
    print("PROBE solutions: importable")
except ImportError:
    print("PROBE solutions: not importable")
print("PROBE sys.path:", sys.path)
print("PROBE cwd:", os.getcwd())
print("PROBE env:", sorted(os.environ))


@triton.jit
def _gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = x / (1.0 + tl.exp(-1.5957691216057308 * (x + 0.044715 * x * x * x)))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def gelu(x):
    xc = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = xc.numel()
    _gelu_kernel[(triton.cdiv(n, 1024),)](xc, y, n, BLOCK=1024)
    return y
