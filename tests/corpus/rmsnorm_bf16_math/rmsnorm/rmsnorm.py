"""RMSNorm in the style of Hugging Face's LlamaRMSNorm: the mean of squares and rstd in float32, then
x̂ = x·rstd rounded back to the input dtype and multiplied by the weight in that dtype (no cast to float32 for
the last product). On a GPU that is two roundings instead of one, inside the fp16 and bf16 tolerances. The Triton
interpreter computes bf16 arithmetic wrongly, so there the bfloat16 cases fail while float32 and float16 are
right; a fair report says those failures may be the interpreter's.

status: forward: graded
status: backward: graded
passes: forward.examples[dtype=float32]
passes: forward.examples[dtype=float16]
passes: backward.examples[dtype=float32]
passes: forward.bad_input
cpu-only: fails: forward.examples[dtype=bfloat16]: .
cpu-only: note: forward.correctness[dtype=bfloat16]: interpreter
cpu-only: note: backward.correctness[dtype=bfloat16]: interpreter
gpu-only: passes: forward.correctness
gpu-only: passes: backward.correctness
passes: forward.integrity
flags: none
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
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_xm + offs * stride_xn, mask=mask, other=0.0)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    # the reduction in fp32 (x^2 overflows fp16)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    tl.store(rstd_ptr + row, rstd)
    # like HF: normalize, go back to the input dtype, then scale by the weight
    x_hat = (xf * rstd).to(x.dtype)
    y = w * x_hat
    tl.store(y_ptr + row * stride_ym + offs, y, mask=mask)


@triton.jit
def _rmsnorm_bwd_kernel(
    x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
    stride_xm, stride_xn, stride_dym, stride_dyn, stride_dxm,
    n_rows, n_cols, rows_per_program,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    start = pid * rows_per_program
    stop = tl.minimum(start + rows_per_program, n_rows)
    for row in range(start, stop):
        x = tl.load(x_ptr + row * stride_xm + offs * stride_xn, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride_dym + offs * stride_dyn, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        x_hat = x * rstd
        c = tl.sum(x_hat * w * dy, axis=0) / n_cols
        tl.store(dx_ptr + row * stride_dxm + offs, (rstd * (w * dy - x_hat * c)).to(dx_ptr.dtype.element_ty),
                 mask=mask)
        dw += dy * x_hat
    tl.store(dw_partial_ptr + pid * n_cols + offs, dw, mask=mask)


@triton.jit
def _rmsnorm_dw_kernel(dw_partial_ptr, dw_ptr, n_partials, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r in range(0, n_partials, BLOCK_M):
        rows = r + tl.arange(0, BLOCK_M)
        total += tl.load(dw_partial_ptr + rows[:, None] * n_cols + cols[None, :],
                         mask=(rows[:, None] < n_partials) & (cols[None, :] < n_cols), other=0.0)
    tl.store(dw_ptr + cols, tl.sum(total, axis=0).to(dw_ptr.dtype.element_ty), mask=cols < n_cols)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        H = x.shape[-1]
        x2 = x.reshape(-1, H)
        rows = x2.shape[0]
        y = torch.empty((rows, H), dtype=x.dtype, device=x.device)
        rstd = torch.empty((rows,), dtype=torch.float32, device=x.device)
        BLOCK_N = triton.next_power_of_2(H)
        _rmsnorm_fwd_kernel[(rows,)](x2, weight, y, rstd, x2.stride(0), x2.stride(1), y.stride(0), H, eps,
                                     BLOCK_N=BLOCK_N, num_warps=max(1, min(16, BLOCK_N // 256)))
        ctx.save_for_backward(x2, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        rows, H = x2.shape
        dy2 = dy.reshape(rows, H)
        dx = torch.empty_like(x2, memory_format=torch.contiguous_format)
        programs = min(rows, 4 * torch.cuda.get_device_properties(x2.device).multi_processor_count
                       if x2.is_cuda else 8)
        rows_per_program = triton.cdiv(rows, programs)
        partial = torch.empty((programs, H), dtype=torch.float32, device=x2.device)
        BLOCK_N = triton.next_power_of_2(H)
        _rmsnorm_bwd_kernel[(programs,)](
            x2, weight, dy2, rstd, dx, partial,
            x2.stride(0), x2.stride(1), dy2.stride(0), dy2.stride(1), dx.stride(0),
            rows, H, rows_per_program,
            BLOCK_N=BLOCK_N, num_warps=max(1, min(16, BLOCK_N // 256)),
        )
        dweight = torch.empty_like(weight)
        _rmsnorm_dw_kernel[(triton.cdiv(H, 128),)](partial, dweight, programs, H, BLOCK_M=32, BLOCK_N=128)
        return dx.view(dy.shape), dweight, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if weight.ndim != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight has shape {tuple(weight.shape)}, expected ({x.shape[-1]},)")
    return _RMSNorm.apply(x, weight.contiguous(), eps)
