"""FlashAttention forward with block pointers, as in the block-pointer submission, but its launcher hands the
kernel V's strides for K too — a copy-and-paste slip that stays hidden while q, k and v share one layout. Right
wherever they do; wrong where each tensor has a layout of its own (the "mixed" layout). Honest and wrong: no flag.

status: forward: graded
fails: forward.examples[layout=mixed]: is wrong on
passes: forward.examples[layout=contiguous]
passes: forward.examples[layout=transposed]
passes: forward.integrity
flags: none
all-checks-run
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _attn_fwd(
    Q, K, V, O, LSE,
    stride_qb, stride_qm, stride_qd,
    stride_kb, stride_kn, stride_kd,
    stride_vb, stride_vn, stride_vd,
    stride_ob, stride_om, stride_od,
    Nq, Nk, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    off_b = tl.program_id(1).to(tl.int64)

    # block pointers for this (batch*head): Q tile, K^T tiles and V tiles
    q_ptrs = tl.make_block_ptr(Q + off_b * stride_qb, shape=(Nq, HEAD_DIM), strides=(stride_qm, stride_qd),
                               offsets=(start_m, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    kt_ptrs = tl.make_block_ptr(K + off_b * stride_kb, shape=(HEAD_DIM, Nk), strides=(stride_kd, stride_kn),
                                offsets=(0, 0), block_shape=(HEAD_DIM, BLOCK_N), order=(0, 1))
    v_ptrs = tl.make_block_ptr(V + off_b * stride_vb, shape=(Nk, HEAD_DIM), strides=(stride_vn, stride_vd),
                               offsets=(0, 0), block_shape=(BLOCK_N, HEAD_DIM), order=(1, 0))

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E  # work with exp2

    q = tl.load(q_ptrs, boundary_check=(0,), padding_option="zero")

    # causal: key tiles past the diagonal are never visited
    if CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, Nk)
    else:
        hi = Nk
    for start_n in range(0, hi, BLOCK_N):
        kt = tl.load(kt_ptrs, boundary_check=(1,), padding_option="zero")
        s = tl.dot(q, kt) * qk_scale
        # keys past Nk are zero-padded: they must not enter the softmax
        valid = (start_n + offs_n)[None, :] < Nk
        if CAUSAL:
            valid = valid & (offs_m[:, None] >= (start_n + offs_n)[None, :])
        s = tl.where(valid, s, float("-inf"))

        # online softmax update
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptrs, boundary_check=(0,), padding_option="zero")
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

        kt_ptrs = tl.advance(kt_ptrs, (0, BLOCK_N))
        v_ptrs = tl.advance(v_ptrs, (BLOCK_N, 0))

    o = acc / l_i[:, None]
    o_ptrs = tl.make_block_ptr(O + off_b * stride_ob, shape=(Nq, HEAD_DIM), strides=(stride_om, stride_od),
                               offsets=(start_m, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    tl.store(o_ptrs, o.to(O.dtype.element_ty), boundary_check=(0,))
    # m_i is in base 2: back to natural log
    lse = (m_i + tl.math.log2(l_i)) * LN2
    tl.store(LSE + off_b * Nq + offs_m, lse, mask=offs_m < Nq)


def _check_inputs(q, k, v, is_causal):
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"q, k, v must have the same number of dims (got shapes {q.shape}, {k.shape}, {v.shape})")
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        raise ValueError("q, k and v must have the same leading (batch/head) dims")
    if q.shape[-1] != k.shape[-1] or q.shape[-1] != v.shape[-1]:
        raise ValueError("q, k and v must have the same head dim D")
    if q.shape[-1] not in (16, 32, 64, 128):
        raise ValueError(f"head dim D={q.shape[-1]} is not supported (16, 32, 64 or 128)")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError("k and v must have the same sequence length")
    if is_causal and q.shape[-2] != k.shape[-2]:
        raise ValueError("is_causal needs Nq == Nk")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on the same device")
    if torch.cuda.is_available() and q.device.type != "cuda":
        raise ValueError("q, k, v must be cuda tensors")


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_inputs(q, k, v, is_causal)
    *lead, Nq, D = q.shape
    Nk = k.shape[-2]
    if scale is None:
        scale = D ** -0.5
    # flatten batch and heads into one axis (a view when possible)
    q3, k3, v3 = q.reshape(-1, Nq, D), k.reshape(-1, Nk, D), v.reshape(-1, Nk, D)
    B = q3.shape[0]
    o = torch.empty((B, Nq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Nq), dtype=torch.float32, device=q.device)

    # small tiles are much faster in the interpreter
    BLOCK_M, BLOCK_N = (32, 32) if os.environ.get("TRITON_INTERPRET") == "1" else (64, 64)
    grid = (triton.cdiv(Nq, BLOCK_M), B)
    _attn_fwd[grid](
        q3, k3, v3, o, lse,
        q3.stride(0), q3.stride(1), q3.stride(2),
        v3.stride(0), v3.stride(1), v3.stride(2),
        v3.stride(0), v3.stride(1), v3.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        Nq, Nk, scale,
        HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=is_causal,
        num_warps=4, num_stages=2,
    )
    return o.view(*lead, Nq, D), lse.view(*lead, Nq)


def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
    is_causal: bool = False, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError("backward: TODO")


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        raise NotImplementedError("backward: TODO")

    @staticmethod
    def backward(ctx, do):
        raise NotImplementedError("backward: TODO")


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    return _FlashAttention.apply(q, k, v, is_causal, scale)
