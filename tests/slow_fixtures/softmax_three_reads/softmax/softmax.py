"""Slowed but correct softmax: each row is read three times, by three kernels.

slower: forward

Kernel 1 reads every row for its max, kernel 2 reads it again for the sum of exp(x - max), kernel
3 reads it a third time to write exp(x - max) / sum. That is 3 reads + 1 write of the tensor
instead of 1 + 1: about half the speed of a fused kernel. Correct everywhere (masked rows give NaN
like torch.softmax); it must lose speed credit ("extra passes over memory").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # a constexpr: kernels may read it (plain globals fail on the GPU)
BLOCK = 2048


@triton.jit
def _row_max_kernel(x_ptr, m_ptr, n_cols, stride_xm, stride_xn, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_SIZE)
    m = tl.full((BLOCK_SIZE,), -float("inf"), tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        mask = start + offs_n < n_cols
        x = tl.load(x_ptr + row * stride_xm + (start + offs_n) * stride_xn, mask=mask, other=-float("inf"))
        m = tl.maximum(m, x.to(tl.float32))
    tl.store(m_ptr + row, tl.max(m, axis=0))


@triton.jit
def _row_sum_kernel(x_ptr, m_ptr, d_ptr, n_cols, stride_xm, stride_xn, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_SIZE)
    m = tl.load(m_ptr + row)
    shift = tl.where(m == -float("inf"), 0.0, m)  # a fully masked row: exp(-inf) = 0, not NaN
    d = tl.zeros((BLOCK_SIZE,), tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        mask = start + offs_n < n_cols
        x = tl.load(x_ptr + row * stride_xm + (start + offs_n) * stride_xn, mask=mask, other=-float("inf"))
        d += tl.exp2((x.to(tl.float32) - shift) * LOG2E)
    tl.store(d_ptr + row, tl.sum(d, axis=0))


@triton.jit
def _normalize_kernel(x_ptr, m_ptr, d_ptr, y_ptr, n_cols, stride_xm, stride_xn, stride_ym,
                      BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_SIZE)
    m = tl.load(m_ptr + row)
    inv_d = 1.0 / tl.load(d_ptr + row)  # 1/0 = inf for a fully masked row; exp(-inf - -inf) = NaN
    for start in range(0, n_cols, BLOCK_SIZE):
        mask = start + offs_n < n_cols
        x = tl.load(x_ptr + row * stride_xm + (start + offs_n) * stride_xn, mask=mask, other=-float("inf"))
        y = tl.exp2((x.to(tl.float32) - m) * LOG2E) * inv_d
        tl.store(y_ptr + row * stride_ym + start + offs_n, y.to(y_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension (``torch.softmax(x, -1)`` semantics)."""
    if x.dim() == 0:
        raise ValueError("softmax needs at least one dimension")
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols)
    n_rows = x2.shape[0]
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y.view(x.shape)
    m = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    d = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    block = min(BLOCK, triton.next_power_of_2(n_cols))
    grid = (n_rows,)
    _row_max_kernel[grid](x2, m, n_cols, x2.stride(0), x2.stride(1), BLOCK_SIZE=block)
    _row_sum_kernel[grid](x2, m, d, n_cols, x2.stride(0), x2.stride(1), BLOCK_SIZE=block)
    _normalize_kernel[grid](x2, m, d, y, n_cols, x2.stride(0), x2.stride(1), y.stride(0), BLOCK_SIZE=block)
    return y.view(x.shape)
