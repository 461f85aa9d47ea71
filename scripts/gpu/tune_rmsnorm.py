"""Sweep RMSNorm forward launch shapes on the GPU: rows per program x num_warps, against torch.compile."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _fwd_rows(x_ptr, w_ptr, y_ptr, rstd_ptr, n_rows, n_cols, eps,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)
    ptrs = offs_m[:, None].to(tl.int64) * n_cols + offs_n[None, :]
    x = tl.load(x_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs_n, mask=offs_n < n_cols, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + offs_m, rstd, mask=offs_m < n_rows)


def formula(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


compiled = torch.compile(formula)
for (M, H), dtype in [((16384, 4096), torch.bfloat16), ((4096, 16384), torch.bfloat16),
                      ((16384, 4096), torch.float32), ((4096, 16384), torch.float32)]:
    x = torch.randn(M, H, device="cuda", dtype=dtype)
    w = torch.randn(H, device="cuda", dtype=dtype)
    nbytes = 2 * x.numel() * x.element_size()
    copy = do_bench(lambda: x.clone(), return_mode="median")
    comp = do_bench(lambda: compiled(x, w), return_mode="median")
    res = []
    BLOCK_N = triton.next_power_of_2(H)
    for bm in (1, 2, 4):
        if bm * BLOCK_N > 32768:
            continue
        for nw in (4, 8, 16, 32):
            y = torch.empty_like(x)
            r = torch.empty(M, device="cuda", dtype=torch.float32)
            fn = lambda: _fwd_rows[(triton.cdiv(M, bm),)](x, w, y, r, M, H, 1e-6, BLOCK_M=bm, BLOCK_N=BLOCK_N,
                                                          num_warps=nw)
            fn()
            err = (y.float() - formula(x, w).float()).abs().max().item()
            t = do_bench(fn, return_mode="median")
            res.append((copy / t, bm, nw, comp / t, err))
    res.sort(reverse=True)
    print(f"{M}x{H} {dtype}: copy {nbytes / copy / 1e6:.0f} GB/s, compile {copy / comp:.1%} of copy | "
          + " | ".join(f"rows {bm} warps {nw}: {r:.1%} of copy, {c:.3f}x compile" for r, bm, nw, c, e in res[:4]),
          flush=True)
