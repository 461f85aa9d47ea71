"""Exercise 5: FlashAttention-2, forward and backward, in Triton. Read assignments/flash_attention/README.md.

Keep the names and signatures of the three public functions. The kernels below are a suggested
layout (one forward kernel; a Δ pre-pass, a dK/dV kernel and a dQ kernel for the backward): change
their arguments freely. Start with the forward (graded on its own), then the backward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _attn_fwd(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qm, stride_kb, stride_kn, stride_vb, stride_vn, stride_ob, stride_om,
    Nq, Nk, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    """One program per (BLOCK_M queries, batch·head): stream K and V in BLOCK_N tiles."""
    # TODO: load the query tile (mask rows >= Nq); keep a running max m_i, running sum l_i and an
    # fp32 accumulator; for each key tile compute the scores, mask keys >= Nk (and key > query if
    # CAUSAL; skip the tiles entirely above the diagonal), rescale l_i and acc when the max grows,
    # add P·V. Finally store acc / l_i and lse = m_i + log(l_i) (natural log!).
    pass


@triton.jit
def _attn_bwd_delta(o_ptr, do_ptr, delta_ptr, Nq, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Δ = rowsum(dO ∘ O), one float per query row."""
    # TODO
    pass


@triton.jit
def _attn_bwd_dkdv(q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, Nq, Nk,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """One program per BLOCK_N keys: loop over query tiles, recompute P from lse, accumulate
    dV += Pᵀ dO and dK += dSᵀ Q with dS = P ∘ (dP - Δ), dP = dO Vᵀ."""
    # TODO
    pass


@triton.jit
def _attn_bwd_dq(q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, Nq, Nk,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """One program per BLOCK_M queries: loop over key tiles, accumulate dQ += dS K."""
    # TODO
    pass


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(o, lse)``: ``o = softmax(scale · q kᵀ [causal mask]) v`` in q's dtype, shape (..., Nq, D),
    and ``lse`` the natural-log logsumexp of the scaled, masked scores, float32, shape (..., Nq).

    q: (..., Nq, D); k, v: (..., Nk, D) with the same leading dims; D in {16, 32, 64, 128};
    ``scale`` defaults to D ** -0.5; ``is_causal`` masks key j > query i and needs Nq == Nk.
    Raise ValueError/TypeError naming the problem for bad arguments.
    """
    raise NotImplementedError(
        "flash_attention_forward is not implemented yet — see assignments/flash_attention/README.md"
    )


def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
    is_causal: bool = False, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``(dq, dk, dv)`` (dtypes and shapes of q, k, v) given the forward's ``o`` and ``lse`` and
    the gradient ``do`` of the loss with respect to ``o``."""
    raise NotImplementedError(
        "flash_attention_backward is not implemented yet — see assignments/flash_attention/README.md"
    )


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        # TODO: run flash_attention_forward, save what the backward needs, return o
        raise NotImplementedError("flash_attention is not implemented yet — see assignments/flash_attention/README.md")

    @staticmethod
    def backward(ctx, do):
        # TODO: return dq, dk, dv and None for is_causal and scale
        raise NotImplementedError("flash_attention is not implemented yet — see assignments/flash_attention/README.md")


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """Differentiable attention: ``flash_attention(q, k, v).backward(do)`` runs your Triton backward."""
    return _FlashAttention.apply(q, k, v, is_causal, scale)
