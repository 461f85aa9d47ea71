"""Broken: the kernel writes NaN everywhere."""
import torch
import triton
import triton.language as tl


@triton.jit
def _nan_kernel(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    nan = tl.full((BLOCK,), float("nan"), tl.float32)
    tl.store(y_ptr + offs, nan.to(y_ptr.dtype.element_ty), mask=offs < n)


def gelu(x):
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _nan_kernel[(triton.cdiv(y.numel(), 1024),)](y, y.numel(), BLOCK=1024)
    return y
