"""Exercise 4: a tiled matmul with a fused GeLU epilogue. Read assignments/matmul/README.md first.

Fill in ``_gelu``, ``_matmul_kernel`` and ``matmul``. Keep the name and signature of ``matmul``: the
tests and the grader call it. You may add parameters to the kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gelu(x):
    """The tanh GeLU of exercise 1 on a float32 tile: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    # TODO: return gelu(x) (your formula from assignments/gelu)
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
    ACTIVATION: tl.constexpr,  # "" or "gelu"
):
    """One program computes one BLOCK_M × BLOCK_N tile of C.

    1. program id -> (pid_m, pid_n), in grouped order (GROUP_M rows of tiles at a time, see the handout)
    2. pointers to the first BLOCK_M × BLOCK_K tile of A and BLOCK_K × BLOCK_N tile of B, through the strides
    3. loop over K: load both tiles (mask the part past K with 0), acc = tl.dot(a, b, acc) in float32
    4. epilogue: apply _gelu if ACTIVATION == "gelu", cast to C's dtype, store with a mask on M and N
    """
    # TODO: your kernel here
    pass


def matmul(a: torch.Tensor, b: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """``activation(a @ b)`` for a (M, K) and b (K, N): float32 accumulation, result (M, N) in a's dtype.

    ``activation`` is None or "gelu". a and b may have any strides (a transposed view, for instance).
    Raise ValueError with a message naming the problem for an unknown activation, inputs that are not
    2-D, inner dimensions that differ (a.shape[1] != b.shape[0]) or different dtypes.
    """
    raise NotImplementedError("matmul is not implemented yet — see assignments/matmul/README.md")
