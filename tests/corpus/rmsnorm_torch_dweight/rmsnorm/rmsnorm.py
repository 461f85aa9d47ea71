"""RMSNorm whose backward kernel writes one row of dweight partial sums per program and then adds the rows up
in PyTorch (``partial.sum(0)``) instead of in a second Triton kernel. The values are right; the reduction is
PyTorch compute inside the graded call, which the integrity rules forbid, so the backward is flagged.

status: forward: graded
status: backward: graded
passes: forward.correctness
passes: forward.integrity
passes: forward.bad_input
passes: backward.correctness
expect: backward.integrity: aten.sum
flags: no-torch-compute
all-checks-run
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_fwd_kernel(
    x_ptr, w_ptr, y_ptr, rstd_ptr,
    stride_xm, stride_xn, stride_ym,
    n_cols, eps,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    rstd = tl.rsqrt(var + eps)
    tl.store(y_ptr + row * stride_ym + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rmsnorm_bwd_kernel(
    x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
    stride_xm, stride_xn, stride_dym, stride_dyn, stride_dxm,
    n_rows, n_cols, rows_per_program,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    for row in range(first, last):
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride_dym + cols * stride_dyn, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = x * rstd
        c = tl.sum(xhat * w * dy, axis=0) / n_cols
        dx = rstd * (w * dy - xhat * c)
        tl.store(dx_ptr + row * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=mask)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        H = x.shape[-1]
        x2 = x.reshape(-1, H)
        M = x2.shape[0]
        y = torch.empty((M, H), dtype=x.dtype, device=x.device)
        rstd = torch.empty((M,), dtype=torch.float32, device=x.device)
        BLOCK_N = triton.next_power_of_2(H)
        _rmsnorm_fwd_kernel[(M,)](x2, weight, y, rstd, x2.stride(0), x2.stride(1), y.stride(0), H, eps,
                                  BLOCK_N=BLOCK_N, num_warps=min(16, max(1, BLOCK_N // 256)))
        ctx.save_for_backward(x2, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        M, H = x2.shape
        dy2 = dy.reshape(M, H)
        dx = torch.empty((M, H), dtype=x2.dtype, device=x2.device)
        n_prog = min(M, 132 if x2.is_cuda else 8)
        rows_per_program = triton.cdiv(M, n_prog)
        partial = torch.empty((n_prog, H), dtype=torch.float32, device=x2.device)
        BLOCK_N = triton.next_power_of_2(H)
        _rmsnorm_bwd_kernel[(n_prog,)](
            x2, weight, dy2, rstd, dx, partial,
            x2.stride(0), x2.stride(1), dy2.stride(0), dy2.stride(1), dx.stride(0),
            M, H, rows_per_program,
            BLOCK_N=BLOCK_N, num_warps=min(16, max(1, BLOCK_N // 256)),
        )
        # the partial sums are tiny (n_prog x H): finish dweight on the PyTorch side
        dweight = partial.sum(0).to(weight.dtype)
        return dx.view(dy.shape), dweight, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    return _RMSNorm.apply(x, weight.contiguous(), eps)
