"""Slowed but correct FlashAttention: a plain FA2 with 16×16 tiles (and no autotuning).

slower: forward
slower: autograd

Each program holds 16 query rows and streams K and V 16 rows at a time: 16×16×D matmuls are far too
small for the tensor cores (H100 wgmma wants 64×N tiles), every K/V tile is re-read from L2 by
Nq/16 programs, and the loop overhead per FLOP is 16-64× that of 128×64 tiles. The backward uses
16×16 tiles too and masks the causal triangle instead of skipping it. Correct everywhere; it must
lose speed credit ("tiles too small for tl.dot").
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, Nq, Nk, qk_scale,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    pid = tl.program_id(0)
    b = tl.program_id(1)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * Nq * D + offs_m[:, None] * D + offs_d[None, :], mask=offs_m[:, None] < Nq, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    hi = Nk
    if CAUSAL:  # keys past the tile's last query are all masked: skip them
        hi = tl.minimum(Nk, (pid + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = offs_n[:, None] < Nk
        k = tl.load(k_ptr + b * Nk * D + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + b * Nk * D + offs_n[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        keep = offs_n[None, :] < Nk
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + b * Nq * D + offs_m[:, None] * D + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < Nq)
    tl.store(lse_ptr + b * Nq + offs_m, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=offs_m < Nq)


def flash_attention_forward(q, k, v, is_causal=False, scale=None):
    *lead, n_q, d = q.shape
    n_k = k.shape[-2]
    scale = d ** -0.5 if scale is None else scale
    q3, k3, v3 = (t.reshape(-1, t.shape[-2], d).contiguous() for t in (q, k, v))
    o = torch.empty_like(q3)
    lse = torch.empty(q3.shape[:-1], dtype=torch.float32, device=q.device)
    BLOCK_M, BLOCK_N = 16, 16
    grid = (triton.cdiv(n_q, BLOCK_M), q3.shape[0])
    _fwd_kernel[grid](q3, k3, v3, o, lse, n_q, n_k, scale * 1.4426950408889634,
                      D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=is_causal)
    return o.view(*lead, n_q, d), lse.view(*lead, n_q)


@triton.jit
def _delta_kernel(o_ptr, do_ptr, delta_ptr, Nq, D: tl.constexpr, BLOCK_M: tl.constexpr):
    b = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = b * Nq * D + offs_m[:, None] * D + tl.arange(0, D)[None, :]
    o = tl.load(o_ptr + offs, mask=offs_m[:, None] < Nq, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=offs_m[:, None] < Nq, other=0.0).to(tl.float32)
    tl.store(delta_ptr + b * Nq + offs_m, tl.sum(o * do, 1), mask=offs_m < Nq)


@triton.jit
def _dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, Nq, Nk, scale,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    pid = tl.program_id(0)
    b = tl.program_id(1)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    kv_offs = b * Nk * D + offs_n[:, None] * D + offs_d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=offs_n[:, None] < Nk, other=0.0)
    v = tl.load(v_ptr + kv_offs, mask=offs_n[:, None] < Nk, other=0.0)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    for start_m in range(0, Nq, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_offs = b * Nq * D + offs_m[:, None] * D + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=offs_m[:, None] < Nq, other=0.0)
        do = tl.load(do_ptr + q_offs, mask=offs_m[:, None] < Nq, other=0.0)
        lse = tl.load(lse_ptr + b * Nq + offs_m, mask=offs_m < Nq, other=0.0)
        delta = tl.load(delta_ptr + b * Nq + offs_m, mask=offs_m < Nq, other=0.0)
        pT = tl.exp(tl.dot(k, tl.trans(q)) * scale - lse[None, :])
        keep = (offs_n[:, None] < Nk) & (offs_m[None, :] < Nq)
        if CAUSAL:
            keep = keep & (offs_m[None, :] >= offs_n[:, None])
        pT = tl.where(keep, pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do)
        dpT = tl.dot(v, tl.trans(do))
        dsT = pT * (dpT - delta[None, :])
        dk += tl.dot(dsT.to(q.dtype), q)
    tl.store(dk_ptr + kv_offs, (dk * scale).to(dk_ptr.dtype.element_ty), mask=offs_n[:, None] < Nk)
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=offs_n[:, None] < Nk)


@triton.jit
def _dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, Nq, Nk, scale,
               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    pid = tl.program_id(0)
    b = tl.program_id(1)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q_offs = b * Nq * D + offs_m[:, None] * D + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=offs_m[:, None] < Nq, other=0.0)
    do = tl.load(do_ptr + q_offs, mask=offs_m[:, None] < Nq, other=0.0)
    lse = tl.load(lse_ptr + b * Nq + offs_m, mask=offs_m < Nq, other=0.0)
    delta = tl.load(delta_ptr + b * Nq + offs_m, mask=offs_m < Nq, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, Nk, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_offs = b * Nk * D + offs_n[:, None] * D + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=offs_n[:, None] < Nk, other=0.0)
        v = tl.load(v_ptr + kv_offs, mask=offs_n[:, None] < Nk, other=0.0)
        p = tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None])
        keep = (offs_m[:, None] < Nq) & (offs_n[None, :] < Nk)
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    tl.store(dq_ptr + q_offs, (dq * scale).to(dq_ptr.dtype.element_ty), mask=offs_m[:, None] < Nq)


def flash_attention_backward(q, k, v, o, lse, do, is_causal=False, scale=None):
    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    scale = d ** -0.5 if scale is None else scale
    q3, k3, v3, o3, do3 = (t.reshape(-1, t.shape[-2], d).contiguous() for t in (q, k, v, o, do))
    lse2 = lse.reshape(-1, n_q).contiguous()
    batch = q3.shape[0]
    delta = torch.empty_like(lse2)
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    BLOCK_M, BLOCK_N = 16, 16
    _delta_kernel[(triton.cdiv(n_q, BLOCK_M), batch)](o3, do3, delta, n_q, D=d, BLOCK_M=BLOCK_M)
    _dkdv_kernel[(triton.cdiv(n_k, BLOCK_N), batch)](q3, k3, v3, do3, dk, dv, lse2, delta, n_q, n_k, scale,
                                                     D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=is_causal)
    _dq_kernel[(triton.cdiv(n_q, BLOCK_M), batch)](q3, k3, v3, do3, dq, lse2, delta, n_q, n_k, scale,
                                                   D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=is_causal)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        o, lse = flash_attention_forward(q, k, v, is_causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale = is_causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return (*flash_attention_backward(q, k, v, o, lse, do, ctx.is_causal, ctx.scale), None, None)


def flash_attention(q, k, v, is_causal=False, scale=None):
    return _FlashAttention.apply(q, k, v, is_causal, scale)
