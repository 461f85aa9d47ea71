"""RMSNorm whose backward saves an allocation by writing dx over the incoming gradient dy (the gradient is not
needed once dx is computed). dy belongs to the caller, so the backward modifies its input: the values are
right, and the backward is flagged for changing an input in place.

status: forward: graded
status: backward: graded
passes: forward.correctness
passes: forward.integrity
passes: forward.bad_input
passes: backward.correctness
expect: backward.integrity: dy
flags: inputs-unchanged, no-aliasing?
all-checks-run
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_fwd_kernel(X, W, Y, RSTD, stride_x_row, stride_x_col, stride_y_row, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    m = offs < N
    x = tl.load(X + row * stride_x_row + offs * stride_x_col, mask=m, other=0.0).to(tl.float32)
    w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y_row + offs, (x * rstd * w).to(Y.dtype.element_ty), mask=m)


@triton.jit
def _rmsnorm_bwd_kernel(
    X, W, DY, RSTD, DW_PARTIAL,
    stride_x_row, stride_x_col, stride_dy_row,
    n_rows, N, rows_per_program,
    BLOCK_N: tl.constexpr,
):
    # dx is written back into DY, row by row, after that row of dy has been read
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    m = offs < N
    w = tl.load(W + offs, mask=m, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for row in range(row_start, row_end):
        x = tl.load(X + row * stride_x_row + offs * stride_x_col, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy_row + offs, mask=m, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        x_hat = x * rstd
        wdy = w * dy
        c = tl.sum(x_hat * wdy, axis=0) / N
        dx = (wdy - x_hat * c) * rstd
        tl.store(DY + row * stride_dy_row + offs, dx.to(DY.dtype.element_ty), mask=m)
        dw_acc += dy * x_hat
    tl.store(DW_PARTIAL + pid * N + offs, dw_acc, mask=m)


@triton.jit
def _rmsnorm_dw_kernel(DW_PARTIAL, DW, n_partials, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_partials, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        tile = tl.load(DW_PARTIAL + rows[:, None] * N + cols[None, :],
                       mask=(rows[:, None] < n_partials) & (cols[None, :] < N), other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(DW + cols, acc.to(DW.dtype.element_ty), mask=cols < N)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        N = x.shape[-1]
        x_2d = x.reshape(-1, N)
        n_rows = x_2d.shape[0]
        y = torch.empty((n_rows, N), dtype=x.dtype, device=x.device)
        rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        BLOCK_N = triton.next_power_of_2(N)
        _rmsnorm_fwd_kernel[(n_rows,)](x_2d, weight, y, rstd, x_2d.stride(0), x_2d.stride(1), y.stride(0), N, eps,
                                       BLOCK_N=BLOCK_N, num_warps=8 if BLOCK_N >= 4096 else 4)
        ctx.save_for_backward(x_2d, weight, rstd)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x_2d, weight, rstd = ctx.saved_tensors
        n_rows, N = x_2d.shape
        # dy is dead after this: reuse its memory for dx
        dy_2d = dy.contiguous().view(n_rows, N)
        n_programs = min(n_rows, 4 * 132 if dy.is_cuda else 8)
        rows_per_program = triton.cdiv(n_rows, n_programs)
        dw_partial = torch.empty((n_programs, N), dtype=torch.float32, device=dy.device)
        BLOCK_N = triton.next_power_of_2(N)
        _rmsnorm_bwd_kernel[(n_programs,)](
            x_2d, weight, dy_2d, rstd, dw_partial,
            x_2d.stride(0), x_2d.stride(1), dy_2d.stride(0),
            n_rows, N, rows_per_program,
            BLOCK_N=BLOCK_N, num_warps=8 if BLOCK_N >= 4096 else 4,
        )
        dweight = torch.empty_like(weight)
        _rmsnorm_dw_kernel[(triton.cdiv(N, 256),)](dw_partial, dweight, n_programs, N, BLOCK_M=32, BLOCK_N=256)
        return dy_2d.view(dy.shape), dweight, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    H = x.shape[-1]
    if weight.dim() != 1 or weight.numel() != H:
        raise ValueError(f"rmsnorm: the weight must be of shape ({H},), not {tuple(weight.shape)}")
    return _RMSNorm.apply(x, weight.contiguous(), eps)
