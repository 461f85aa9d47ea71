"""Reference solution: tiled matrix multiplication C = A·B with an optional fused GeLU epilogue.

Arithmetic intensity. C = A·B for A (M, K) and B (K, N) does 2·M·N·K FLOPs and must move at least
(M·K + K·N + M·N)·sizeof bytes. At 4096³ in bf16 that is 137 GFLOP over 100 MB: ~1365 FLOP/byte,
far above an H100's ridge point (~990 TFLOP/s ÷ 3.35 TB/s ≈ 295 FLOP/byte), so matmul is
compute-bound — the opposite of GeLU (~1 FLOP/byte). What matters is keeping the tensor cores fed:
big tiles (each element loaded into shared memory is reused BLOCK_N or BLOCK_M times), software
pipelining (num_stages) and an L2-friendly program order.

Tiling. Program (pid_m, pid_n) owns one BLOCK_M × BLOCK_N tile of C. It walks K in steps of BLOCK_K,
loading a BLOCK_M × BLOCK_K tile of A and a BLOCK_K × BLOCK_N tile of B and accumulating their
product in fp32 registers (tl.dot runs on tensor cores). Per step it loads (BLOCK_M + BLOCK_N)·BLOCK_K
elements and does 2·BLOCK_M·BLOCK_N·BLOCK_K FLOPs: 128×256×64 tiles give ~85 FLOP per byte loaded
from L2 even before L2 reuse.

Grouped ordering. Programs are numbered so that GROUP_M consecutive programs sweep down a column of
tiles before moving right: a group of programs running at the same time shares its A rows and B
columns, so they come from L2 instead of HBM (tutorial 03-matrix-multiplication).

Fusion. With ``activation="gelu"`` the tanh GeLU is applied to the fp32 accumulator before the
single store: the unfused version writes C, reads it back and writes it again (3·M·N·sizeof extra
bytes — small next to the matmul at 4096³, but a whole extra kernel launch and pass).

Strides are passed explicitly, so transposed or strided inputs are read in place, never copied.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

ACTIVATIONS = (None, "gelu")


@triton.jit
def _gelu(x):
    """tanh GeLU of exercise 1, in fp32: x·sigmoid(2z) = x / (1 + exp(-2z)) has no cancellation."""
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)  # √(2/π)·(x + 0.044715·x³)
    return x / (1.0 + tl.exp2(-2.8853900817779268 * inner))  # exp(-2z) = 2^(-2·log2(e)·z)


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
    # Grouped ordering: map the 1-D program id to (pid_m, pid_n) so that GROUP_M programs in a row
    # share their B columns (and neighbouring groups their A rows) while they are resident in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Rows of A and columns of B past M / N wrap around (% M, % N): those loads stay in bounds and
    # need no mask, and the rows/columns of C they produce are masked off at the store.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        # The K mask: the last step may run past K. Those lanes must load 0 — anything else (the
        # next row of A, whatever lies past B) would be added into every element of C.
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        # fp32 accumulation whatever the input dtype (fp16 partial sums would lose ~3 digits over K).
        # fp32 inputs run as TF32 on NVIDIA tensor cores (10-bit mantissa), exact fp32 in the interpreter.
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # Epilogue: the activation runs on the fp32 tile in registers, then one rounding and one store.
    if ACTIVATION == "gelu":
        acc = _gelu(acc)
    c = acc.to(c_ptr.dtype.element_ty)

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


# Configs for Hopper-class GPUs (H100/H200: 228 KB of shared memory per SM). A stage holds
# (BLOCK_M + BLOCK_N)·BLOCK_K elements; configs that do not fit (fp32) are skipped by the autotuner.
_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_stages=4, num_warps=4),
]
_matmul_kernel_tuned = triton.autotune(configs=_CONFIGS, key=["M", "N", "K", "ACTIVATION"])(_matmul_kernel)

# Autotuning benchmarks every config on first use of each shape: worth it for big problems only.
# Smaller ones (and the interpreter, where autotune cannot run) use one fixed config. tl.dot needs
# every block dimension >= 16.
AUTOTUNE_MIN_MNK = 1 << 30  # 1024³
_FIXED = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}


def _check(a: torch.Tensor, b: torch.Tensor, activation: str | None) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"matmul: unknown activation {activation!r} (expected None or 'gelu')")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul: a and b must be 2-D matrices, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul: inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} "
            f"(a.shape[1] = {a.shape[1]} must equal b.shape[0] = {b.shape[0]})"
        )
    if a.dtype != b.dtype:
        raise ValueError(f"matmul: a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"matmul: a and b must be on the same device, got {a.device} and {b.device}")


def matmul(a: torch.Tensor, b: torch.Tensor, activation: str | None = None) -> torch.Tensor:
    """C = activation(a @ b) for a (M, K) and b (K, N); fp32 accumulation, output in the input dtype."""
    _check(a, b, activation)
    M, K = a.shape
    _, N = b.shape
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    args = (
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
    )
    act = activation or ""
    if os.environ.get("TRITON_INTERPRET") == "1" or M * N * K < AUTOTUNE_MIN_MNK:
        grid = (triton.cdiv(M, _FIXED["BLOCK_M"]) * triton.cdiv(N, _FIXED["BLOCK_N"]),)
        _matmul_kernel[grid](*args, **_FIXED, ACTIVATION=act, num_warps=4, num_stages=3)
    else:
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
        _matmul_kernel_tuned[grid](*args, ACTIVATION=act)
    return c
