"""Correct, but prints 8 MB at import and a line per call: output is capped, grading goes on."""
import sys

import torch
import triton
import triton.language as tl

sys.stdout.write("spam " * ((8 << 20) // 5) + "\n")


@triton.jit
def _gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = x / (1.0 + tl.exp(-1.5957691216057308 * (x + 0.044715 * x * x * x)))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _gelu(x):
    xc = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = xc.numel()
    _gelu_kernel[(triton.cdiv(n, 1024),)](xc, y, n, BLOCK=1024)
    return y


def gelu(x):
    print("computing gelu of", tuple(x.shape), file=sys.stderr)
    return _gelu(x)
