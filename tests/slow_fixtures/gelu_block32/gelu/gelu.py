"""Slowed but correct GeLU: the reference solution with BLOCK_SIZE = 32 (and one warp).

slower: forward

Each program moves only 32 elements (256 bytes in fp32), so millions of tiny programs are launched
and scheduled, and too few loads are in flight to hide HBM latency. Correct everywhere; it must
lose speed credit ("BLOCK too small").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_DIMS = 4


@triton.jit
def _gelu_kernel(
    x_ptr, y_ptr, n_elements,
    size1, size2, size3,  # sizes of dims 1..3 (dim 0 is implied by n_elements)
    stride_x0, stride_x1, stride_x2, stride_x3,
    BLOCK_SIZE: tl.constexpr,
    CONTIGUOUS: tl.constexpr,
):
    # Program `pid` owns elements [pid·BLOCK_SIZE, (pid+1)·BLOCK_SIZE) of the row-major index space.
    pid = tl.program_id(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    # The last program may run past the end: masked lanes neither load nor store.
    mask = offs < n_elements
    if CONTIGUOUS:
        x_offs = offs
    else:
        # Unravel the row-major index into 4-D coordinates, then apply the input's strides.
        i3 = offs % size3
        rest = offs // size3
        i2 = rest % size2
        rest = rest // size2
        i1 = rest % size1
        i0 = rest // size1
        x_offs = i0 * stride_x0 + i1 * stride_x1 + i2 * stride_x2 + i3 * stride_x3
    # Compute in fp32 whatever the storage dtype: one rounding at the store.
    x = tl.load(x_ptr + x_offs, mask=mask).to(tl.float32)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)  # √(2/π)·(x + 0.044715·x³)
    # 0.5·x·(1 + tanh(z)) == x · sigmoid(2z) == x / (1 + exp(-2z)): no cancellation for z << 0,
    # and exp overflowing to +inf gives x/inf = -0, the right limit (tanh via exp would give inf/inf).
    # exp(-2z) = 2^(-2·log2(e)·z): exp2 is the native instruction.
    y = x / (1.0 + tl.exp2(-2.8853900817779268 * inner))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GeLU (tanh approximation) of ``x``: same shape, dtype and device; output contiguous."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    if n == 0:
        return y
    src = x if x.dim() <= MAX_DIMS else x.reshape(-1)  # >4-D: a view if possible, else one copy
    contiguous = src.is_contiguous()
    sizes = [1] * (MAX_DIMS - src.dim()) + list(src.shape)
    strides = [0] * (MAX_DIMS - src.dim()) + list(src.stride())
    BLOCK_SIZE = 32  # deliberately too small (the reference uses 1024)
    grid = (triton.cdiv(n, BLOCK_SIZE),)
    _gelu_kernel[grid](
        src, y, n,
        sizes[1], sizes[2], sizes[3],
        strides[0], strides[1], strides[2], strides[3],
        BLOCK_SIZE=BLOCK_SIZE, CONTIGUOUS=contiguous, num_warps=1,
    )
    return y
