"""FlashAttention forward whose last, partial key tile lets the padded keys into the softmax: their loads are
masked to 0, so they score 0 rather than -inf and add exp(0 - m) to every row's sum. Causal attention hides
them (a padded key comes after every query), so the causal cases are right; the others are wrong wherever Nk
is not a multiple of the key tile. The backward is not written yet.

status: forward: graded
status: backward: not implemented
status: autograd: not implemented
expect: forward.examples[causal=False]: differ
passes: forward.examples[causal=True]
passes: forward.random[causal=True]
passes: forward.bad_input
passes: forward.memory
passes: forward.integrity
flags: none
all-checks-run
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _fwd_kernel(
    Q, K, V, Out, Lse,
    sqb, sqm, sqd, skb, skn, skd, svb, svn, svd,
    Nq, Nk, scale,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, IS_CAUSAL: tl.constexpr,
):
    m_block = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    rows = m_block * BM + tl.arange(0, BM)
    dims = tl.arange(0, D)
    row_ok = rows < Nq

    q = tl.load(Q + head * sqb + rows[:, None] * sqm + dims[None, :] * sqd, mask=row_ok[:, None], other=0.0)

    row_max = tl.full([BM], float("-inf"), tl.float32)
    row_sum = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)

    last = Nk
    if IS_CAUSAL:
        last = tl.minimum((m_block + 1) * BM, Nk)
    for n0 in tl.range(0, last, BN):
        keys = n0 + tl.arange(0, BN)
        key_ok = keys < Nk
        # out-of-range keys load as zeros
        k = tl.load(K + head * skb + keys[:, None] * skn + dims[None, :] * skd, mask=key_ok[:, None], other=0.0)
        v = tl.load(V + head * svb + keys[:, None] * svn + dims[None, :] * svd, mask=key_ok[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale
        if IS_CAUSAL:
            scores = tl.where(keys[None, :] <= rows[:, None], scores, float("-inf"))

        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        rescale = tl.exp(row_max - new_max)
        p = tl.exp(scores - new_max[:, None])
        row_sum = row_sum * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
        row_max = new_max

    o = acc / row_sum[:, None]
    tl.store(Out + head * Nq * D + rows[:, None] * D + dims[None, :], o.to(Out.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(Lse + head * Nq + rows, row_max + tl.log(row_sum), mask=row_ok)


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    # --- argument checks ---
    if q.dim() < 2 or q.dim() != k.dim() or q.dim() != v.dim():
        raise ValueError("q, k, v: expected tensors of shape (..., N, D) with the same number of dims")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError("q, k, v: the batch/head dims must match")
    head_dim = q.shape[-1]
    if head_dim not in (16, 32, 64, 128):
        raise ValueError(f"head dim must be 16, 32, 64 or 128, got {head_dim}")
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        raise ValueError("q, k, v: head dims differ")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError("k and v must have the same number of keys")
    if is_causal and q.shape[-2] != k.shape[-2]:
        raise ValueError("is_causal requires Nq == Nk")
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        raise TypeError("q, k and v must have the same dtype")
    if torch.cuda.is_available() and not q.is_cuda:
        raise ValueError("expected cuda tensors")

    batch_shape = q.shape[:-2]
    Nq, Nk = q.shape[-2], k.shape[-2]
    if scale is None:
        scale = head_dim ** -0.5
    q3 = q.reshape(-1, Nq, head_dim)
    k3 = k.reshape(-1, Nk, head_dim)
    v3 = v.reshape(-1, Nk, head_dim)
    n_heads = q3.shape[0]
    out = torch.empty((n_heads, Nq, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((n_heads, Nq), dtype=torch.float32, device=q.device)

    BM = BN = 32 if os.environ.get("TRITON_INTERPRET") == "1" else 64
    _fwd_kernel[(triton.cdiv(Nq, BM), n_heads)](
        q3, k3, v3, out, lse,
        *q3.stride(), *k3.stride(), *v3.stride(),
        Nq, Nk, scale,
        D=head_dim, BM=BM, BN=BN, IS_CAUSAL=is_causal,
    )
    return out.view(*batch_shape, Nq, head_dim), lse.view(*batch_shape, Nq)


def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
    is_causal: bool = False, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError("flash_attention_backward: TODO")


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        raise NotImplementedError("flash_attention: TODO")

    @staticmethod
    def backward(ctx, do):
        raise NotImplementedError("flash_attention: TODO")


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    return _FlashAttention.apply(q, k, v, is_causal, scale)
