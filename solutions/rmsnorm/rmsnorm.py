"""Reference solution: RMSNorm forward and backward in Triton.

    y = x / sqrt(mean(x², dim=-1) + eps) · weight          (x̂ = x · rstd,  rstd = 1/sqrt(mean(x²) + eps))

Memory traffic. For x of N = rows · H elements of s bytes, the forward must read x and write y:
2·N·s bytes (plus H·s for the weight and 4 bytes of rstd per row, both negligible). It does ~4 FLOPs
per element — about 1 FLOP/byte in bf16, two orders of magnitude under an H100's ridge point, so
the kernel is memory-bound and its yardstick is the bandwidth of a plain copy (which also moves
2·N·s). The PyTorch formula (x.float(), pow, mean, add, rsqrt, mul, mul, to) makes ~6 passes.

Backward, with dy the gradient of y and c = mean(x̂ · weight · dy) per row:

    dx = rstd · (weight · dy − x̂ · c)            (per row: needs a reduction over the row)
    dweight = Σ_rows dy · x̂                       (a reduction over all rows)

The backward kernel reads x and dy and writes dx (3·N·s bytes). Each program walks a contiguous
chunk of rows, keeping its share of dweight in fp32 registers, and writes one row of partial sums;
a second small kernel adds those rows up (no atomics, deterministic).

What the forward saves: rstd (one fp32 per row), so the backward does not recompute the mean of x².
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_H = 65536  # one row must fit in one block (registers/shared memory); see rmsnorm()


@triton.jit
def _rmsnorm_fwd_kernel(
    x_ptr, w_ptr, y_ptr, rstd_ptr,
    stride_xm, stride_xn, stride_ym,
    n_cols, eps,
    BLOCK_N: tl.constexpr,
):
    # One program per row; the whole row is loaded once and stays in registers.
    row = tl.program_id(0).to(tl.int64)  # row * stride can exceed 2^31 for big tensors
    offs_n = tl.arange(0, BLOCK_N)
    mask = offs_n < n_cols  # BLOCK_N is the next power of two ≥ H: mask the padding lanes
    # Padding lanes load 0.0 so they add nothing to the sum of squares.
    x = tl.load(x_ptr + row * stride_xm + offs_n * stride_xn, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs_n, mask=mask, other=0.0).to(tl.float32)
    # Mean over the true H (n_cols), not BLOCK_N; eps goes inside the square root.
    mean_sq = tl.sum(x * x, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(mean_sq + eps)
    y = x * rstd * w
    tl.store(y_ptr + row * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rmsnorm_bwd_kernel(
    x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr,
    stride_xm, stride_xn, stride_dym, stride_dyn, stride_dxm,
    n_rows, n_cols, rows_per_program,
    BLOCK_N: tl.constexpr,
):
    # Program p handles rows [p·rows_per_program, (p+1)·rows_per_program) and writes row p of the
    # (n_programs, H) fp32 buffer of dweight partial sums.
    pid = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)
    mask = offs_n < n_cols
    dw_acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    # Row pointers advance by one stride per row (64-bit pointer arithmetic: no int32 overflow).
    start = row_start.to(tl.int64)
    x_row = x_ptr + start * stride_xm
    dy_row = dy_ptr + start * stride_dym
    dx_row = dx_ptr + start * stride_dxm
    for row in range(row_start, row_end):
        x = tl.load(x_row + offs_n * stride_xn, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + offs_n * stride_dyn, mask=mask, other=0.0).to(tl.float32)
        # weight is re-read for every row (an L1/L2 hit) rather than held in registers next to x, dy
        # and dw_acc: at H = 16384 that would spill.
        w = tl.load(w_ptr + offs_n, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        x_hat = x * rstd
        wdy = w * dy
        # Padding lanes are 0 in x_hat and wdy, so they add nothing to c.
        c = tl.sum(x_hat * wdy, axis=0) / n_cols
        dx = (wdy - x_hat * c) * rstd
        tl.store(dx_row + offs_n, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += dy * x_hat
        x_row += stride_xm
        dy_row += stride_dym
        dx_row += stride_dxm
    tl.store(dw_partial_ptr + pid * n_cols + offs_n, dw_acc, mask=mask)


@triton.jit
def _rmsnorm_dw_kernel(
    dw_partial_ptr, dw_ptr,
    n_partials, n_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Column block pid_n of dweight: sum the n_partials rows of the partial-sum buffer.
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, n_partials, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        mask = (offs_m[:, None] < n_partials) & (offs_n[None, :] < n_cols)
        acc += tl.load(dw_partial_ptr + offs_m[:, None] * n_cols + offs_n[None, :], mask=mask, other=0.0)
    dw = tl.sum(acc, axis=0)
    tl.store(dw_ptr + offs_n, dw.to(dw_ptr.dtype.element_ty), mask=offs_n < n_cols)


def _num_warps(block_n: int) -> int:
    # 8 elements per thread (one 16-byte load in bf16) up to 16 warps: enough loads in flight to cover
    # HBM latency with few enough registers that several rows fit on an SM at once.
    return max(1, min(16, block_n // 256))


def _fwd_num_warps(block_n: int, element_size: int) -> int:
    # Measured on an H200 (a sweep of warps, H = 4096 and 16384): 8 warps for 16-bit rows
    # (96-98% of copy bandwidth; 16 warps lost ~10% at H = 4096), 16 for fp32 rows (97%).
    if block_n < 2048:
        return _num_warps(block_n)
    return 8 if element_size <= 2 else 16


def _n_programs(n_rows: int, device: torch.device) -> int:
    if device.type == "cuda":
        # A few programs per SM fill the GPU; more would only make the partial-sum buffer bigger.
        return min(n_rows, 4 * torch.cuda.get_device_properties(device).multi_processor_count)
    return min(n_rows, 8)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        H = x.shape[-1]
        x2 = x.reshape(-1, H)  # a view when the leading dims can be merged, else one copy
        n_rows = x2.shape[0]
        y = torch.empty((n_rows, H), dtype=x.dtype, device=x.device)
        rstd = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
        block_n = triton.next_power_of_2(H)
        if n_rows > 0:
            _rmsnorm_fwd_kernel[(n_rows,)](
                x2, weight, y, rstd,
                x2.stride(0), x2.stride(1), y.stride(0),
                H, eps,
                BLOCK_N=block_n, num_warps=_fwd_num_warps(block_n, x.element_size()),
            )
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        n_rows, H = x2.shape
        dy2 = dy.reshape(n_rows, H)
        dx = torch.empty((n_rows, H), dtype=x2.dtype, device=x2.device)
        dw = torch.empty((H,), dtype=weight.dtype, device=weight.device)
        n_programs = max(1, _n_programs(n_rows, x2.device))
        rows_per_program = triton.cdiv(max(n_rows, 1), n_programs)
        dw_partial = torch.empty((n_programs, H), dtype=torch.float32, device=x2.device)
        block_n = triton.next_power_of_2(H)
        if n_rows > 0:
            _rmsnorm_bwd_kernel[(n_programs,)](
                x2, weight, dy2, rstd, dx, dw_partial,
                x2.stride(0), x2.stride(1), dy2.stride(0), dy2.stride(1), dx.stride(0),
                n_rows, H, rows_per_program,
                BLOCK_N=block_n, num_warps=_num_warps(block_n),
            )
        else:
            dw_partial.zero_()
        # Narrow column blocks spread the (n_programs, H) reduction over many programs on a GPU; the
        # interpreter prefers few, wide ones.
        block_n_dw = min(64 if x2.is_cuda else 1024, block_n)
        _rmsnorm_dw_kernel[(triton.cdiv(H, block_n_dw),)](
            dw_partial, dw, n_programs, H,
            BLOCK_M=64, BLOCK_N=block_n_dw, num_warps=4,
        )
        return dx.view(ctx.x_shape), dw, None


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension: ``x / sqrt(mean(x², -1) + eps) * weight``.

    Differentiable in ``x`` and ``weight``. ``x`` may have any leading dimensions and strides;
    ``weight`` has shape (H,). The result has ``x``'s shape and dtype.
    """
    if x.dim() == 0:
        raise ValueError("rmsnorm: x must have at least one dimension (the hidden size H)")
    H = x.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != H:
        raise ValueError(
            f"rmsnorm: weight must have shape ({H},) to match x's last dimension, got {tuple(weight.shape)}"
        )
    if weight.device != x.device:
        raise ValueError(f"rmsnorm: x is on {x.device} but weight is on {weight.device}")
    if H > MAX_H:
        raise ValueError(f"rmsnorm: hidden size {H} > {MAX_H} is not supported (one row must fit in one block)")
    if weight.stride(0) != 1:
        weight = weight.contiguous()  # H elements: a negligible copy, and the kernels can assume stride 1
    return _RMSNorm.apply(x, weight, eps)
