"""Tiled matmul with grouped ordering and masked K tails, right for activation=None, whose GeLU epilogue is not
written yet: matmul(..., activation="gelu") raises NotImplementedError. The part is graded, not "not
implemented": only the gelu cases fail, and every other case and bad input still runs and passes.

status: forward: graded
fails: forward.examples[activation=gelu]: NotImplementedError
passes: forward.examples[activation=None]
passes: forward.random[activation=None]
passes: forward.bad_input
flags: none
all-checks-run
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gelu(x):
    # TODO: the tanh GeLU epilogue
    return x


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    # grouped ordering: GROUP_M rows of tiles at a time, for L2 reuse
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # wrap the row/column indices so every load is in bounds; the store is masked instead
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if ACTIVATION == "gelu":
        acc = _gelu(acc)
    c = acc.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    if activation not in (None, "gelu"):
        raise ValueError(f"unknown activation {activation!r} (use None or 'gelu')")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul needs 2-D matrices, got {a.dim()}-D and {b.dim()}-D")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if activation == "gelu":
        raise NotImplementedError("the fused GeLU epilogue is not done yet")

    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 32
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    _matmul_kernel[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=8,
        ACTIVATION="" if activation is None else activation,
        num_warps=4, num_stages=3,
    )
    return c
