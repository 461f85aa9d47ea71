"""Exercise 3: RMSNorm forward and backward in Triton. Read assignments/rmsnorm/README.md first.

Fill in the three kernels, ``_RMSNorm.forward`` / ``_RMSNorm.backward`` and ``rmsnorm``. Keep the name
and signature of ``rmsnorm``: the tests and the grader call it. You may add parameters to the kernels
(strides, for instance) or change how the work is split, as long as Triton kernels do the math.
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
    """One program per row (BLOCK_N ≥ n_cols, a power of two).

    1. load the row of x (masked: padding lanes must not change the sum of squares) and the weight
    2. rstd = 1 / sqrt(mean(x²) + eps) in float32 — the mean is over n_cols, not BLOCK_N
    3. store y = x · rstd · w in y's dtype, and rstd (one float32 per row) for the backward
    """
    # TODO: your kernel here
    pass


@triton.jit
def _rmsnorm_bwd_kernel(
    x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
    stride_xm, stride_xn, stride_dym, stride_dyn, stride_dxm,
    n_rows, n_cols, rows_per_program,
    BLOCK_N: tl.constexpr,
):
    """Program p handles rows [p·rows_per_program, (p+1)·rows_per_program) (the last chunk may be short).

    For each row: x̂ = x · rstd, c = mean(x̂ · w · dy), dx = rstd · (w · dy − x̂ · c); store dx.
    Accumulate dy · x̂ over the program's rows in a float32 vector, and store it as row p of the
    (n_programs, n_cols) float32 buffer dw_partial.
    """
    # TODO: your kernel here
    pass


@triton.jit
def _rmsnorm_dw_kernel(
    dw_partial_ptr, dw_ptr,
    n_partials, n_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dweight = the sum of the n_partials rows of dw_partial. Program pid_n owns BLOCK_N columns and
    loops over the rows BLOCK_M at a time."""
    # TODO: your kernel here
    pass


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # TODO: view x as (rows, H), allocate y and rstd, launch _rmsnorm_fwd_kernel,
        # ctx.save_for_backward(...) what the backward needs, return y with x's shape.
        raise NotImplementedError("the RMSNorm forward is not implemented yet — see assignments/rmsnorm/README.md")

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        # TODO: launch _rmsnorm_bwd_kernel then _rmsnorm_dw_kernel; return dx, dweight, None (no grad for eps).
        raise NotImplementedError("the RMSNorm backward is not implemented yet — see assignments/rmsnorm/README.md")


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension: ``x / sqrt(mean(x², dim=-1) + eps) * weight``.

    ``x`` has any leading dimensions and any strides; ``weight`` has shape (H,) where H = x.shape[-1]
    (otherwise raise ValueError naming the weight). Returns a new tensor with x's shape and dtype.
    Differentiable in ``x`` and ``weight`` through ``_RMSNorm``.
    """
    raise NotImplementedError("rmsnorm is not implemented yet — see assignments/rmsnorm/README.md")
