"""FlashAttention forward with plain pointer arithmetic and masks, right in every value, but it hands lse back in
bfloat16 rather than float32 (an honest mistake: o is right and lse holds the right values, rounded). The
correctness checks fail on lse's dtype; nothing about it is an integrity or a cached-result matter. The backward
is not written yet.

status: forward: graded
status: backward: not implemented
status: autograd: not implemented
fails: forward.correctness: lse: dtype
passes: forward.bad_input
passes: forward.memory
flags: none
all-checks-run
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

RCP_LN2 = tl.constexpr(1.4426950408889634)  # 1 / ln(2) = log2(e)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _attn_fwd(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qm, stride_qd,
    stride_kb, stride_kn, stride_kd,
    stride_vb, stride_vn, stride_vd,
    stride_ob, stride_om,
    Nq, Nk, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    q = tl.load(q_ptr + bh * stride_qb + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=offs_m[:, None] < Nq, other=0.0)
    k_base = k_ptr + bh * stride_kb
    v_base = v_ptr + bh * stride_vb

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = scale * RCP_LN2

    n_end = Nk
    if CAUSAL:
        n_end = tl.minimum((pid_m + 1) * BLOCK_M, Nk)
    for start_n in range(0, n_end, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=cols[:, None] < Nk,
                    other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=cols[:, None] < Nk,
                    other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        keep = cols[None, :] < Nk
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_ij[:, None])
        corr = tl.math.exp2(m_i - m_ij)
        acc = acc * corr[:, None] + tl.dot(p.to(v.dtype), v)
        l_i = l_i * corr + tl.sum(p, 1)
        m_i = m_ij

    out = acc / l_i[:, None]
    tl.store(o_ptr + bh * stride_ob + offs_m[:, None] * stride_om + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < Nq)
    lse = (m_i + tl.math.log2(l_i)) * LN2
    tl.store(lse_ptr + bh * Nq + offs_m, lse.to(lse_ptr.dtype.element_ty), mask=offs_m < Nq)


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim() or q.shape[:-2] != k.shape[:-2] \
            or k.shape[:-2] != v.shape[:-2]:
        raise ValueError("q, k, v must have the same leading dims")
    D = q.shape[-1]
    if k.shape[-1] != D or v.shape[-1] != D:
        raise ValueError("q, k, v must have the same head dim")
    if D not in (16, 32, 64, 128):
        raise ValueError(f"head dim {D} not supported")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError("k and v lengths differ")
    if is_causal and q.shape[-2] != k.shape[-2]:
        raise ValueError("causal needs Nq == Nk")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError("mixed dtypes")
    if torch.cuda.is_available() and q.device.type != "cuda":
        raise ValueError("inputs must be on the cuda device")

    *lead, Nq, D = q.shape
    Nk = k.shape[-2]
    scale = scale if scale is not None else 1.0 / D ** 0.5
    q3, k3, v3 = q.reshape(-1, Nq, D), k.reshape(-1, Nk, D), v.reshape(-1, Nk, D)
    BH = q3.shape[0]
    o = torch.empty((BH, Nq, D), device=q.device, dtype=q.dtype)
    # lse only feeds an exp() in the backward: bf16 saves half the memory
    lse = torch.empty((BH, Nq), device=q.device, dtype=torch.bfloat16)

    BLOCK = 32 if os.environ.get("TRITON_INTERPRET") == "1" else 64
    _attn_fwd[(triton.cdiv(Nq, BLOCK), BH)](
        q3, k3, v3, o, lse,
        q3.stride(0), q3.stride(1), q3.stride(2),
        k3.stride(0), k3.stride(1), k3.stride(2),
        v3.stride(0), v3.stride(1), v3.stride(2),
        o.stride(0), o.stride(1),
        Nq, Nk, scale,
        HEAD_DIM=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK, CAUSAL=is_causal,
    )
    return o.reshape(*lead, Nq, D), lse.reshape(*lead, Nq)


def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
    is_causal: bool = False, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError("not done yet")


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        raise NotImplementedError("not done yet")

    @staticmethod
    def backward(ctx, do):
        raise NotImplementedError("not done yet")


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    return _FlashAttention.apply(q, k, v, is_causal, scale)
