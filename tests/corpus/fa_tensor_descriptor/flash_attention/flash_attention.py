"""FlashAttention forward through device-side tensor descriptors (tl.make_tensor_descriptor, the TMA engine on
Hopper): rows past Nq or Nk load as zeros and stores past them are dropped, so tiles need no load or store
masks; padded keys still get a -inf score. Triton 3.6's interpreter runs tensor descriptors, so the verdict
is the same on a CPU and a GPU. The backward is not written yet.

status: forward: graded
status: backward: not implemented
status: autograd: not implemented
passes: forward.correctness
passes: forward.integrity
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

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


def _tma_scratch(size: int, alignment: int, stream):
    # device-side descriptors are written to global memory that Triton asks us for
    return torch.empty(size, dtype=torch.int8, device="cuda")


@triton.jit
def _attn_fwd(
    Q, K, V, O, LSE,
    Nq, Nk, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    off_b = tl.program_id(1).to(tl.int64)

    # q, k, v, o are contiguous (B, N, D): one 2-D descriptor per head
    q_desc = tl.make_tensor_descriptor(Q + off_b * Nq * HEAD_DIM, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K + off_b * Nk * HEAD_DIM, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V + off_b * Nk * HEAD_DIM, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(O + off_b * Nq * HEAD_DIM, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E

    q = q_desc.load([start_m, 0])
    end_n = tl.minimum(start_m + BLOCK_M, Nk) if CAUSAL else Nk
    for start_n in range(0, end_n, BLOCK_N):
        k = k_desc.load([start_n, 0])
        s = tl.dot(q, tl.trans(k)) * qk_scale
        # TMA pads with zeros, and a zero score is not "no key": mask keys >= Nk
        ok = (start_n + offs_n)[None, :] < Nk
        if CAUSAL:
            ok = ok & ((start_n + offs_n)[None, :] <= offs_m[:, None])
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = alpha * l_i + tl.sum(p, axis=1)
        v = v_desc.load([start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new

    o_desc.store([start_m, 0], (acc / l_i[:, None]).to(O.dtype.element_ty))
    tl.store(LSE + off_b * Nq + offs_m, (m_i + tl.math.log2(l_i)) * LN2, mask=offs_m < Nq)


def _validate(q, k, v, is_causal):
    if q.dim() < 2 or q.dim() != k.dim() or q.dim() != v.dim():
        raise ValueError("q, k, v need the same number of dims, at least 2")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"leading dims differ: {tuple(q.shape[:-2])}, {tuple(k.shape[:-2])}, {tuple(v.shape[:-2])}")
    D = q.shape[-1]
    if k.shape[-1] != D or v.shape[-1] != D:
        raise ValueError("head dim D differs between q, k and v")
    if D not in (16, 32, 64, 128):
        raise ValueError(f"unsupported head dim {D}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError("k and v have different lengths")
    if is_causal and q.shape[-2] != k.shape[-2]:
        raise ValueError("causal attention needs Nq == Nk")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError("q, k, v must share one dtype")
    if torch.cuda.is_available() and not (q.is_cuda and k.is_cuda and v.is_cuda):
        raise ValueError("q, k, v must be on the GPU (cuda)")


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    # TMA wants a unit last stride and 16-byte aligned addresses: copy if needed
    if not t.is_contiguous() or t.data_ptr() % 16 != 0:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    _validate(q, k, v, is_causal)
    *lead, Nq, D = q.shape
    Nk = k.shape[-2]
    scale = D ** -0.5 if scale is None else scale
    q3 = _tma_ready(q.reshape(-1, Nq, D))
    k3 = _tma_ready(k.reshape(-1, Nk, D))
    v3 = _tma_ready(v.reshape(-1, Nk, D))
    B = q3.shape[0]
    o = torch.empty((B, Nq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Nq), dtype=torch.float32, device=q.device)

    if q.is_cuda:
        triton.set_allocator(_tma_scratch)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    BLOCK_M = BLOCK_N = 32 if interpreted else 64
    grid = (triton.cdiv(Nq, BLOCK_M), B)
    _attn_fwd[grid](q3, k3, v3, o, lse, Nq, Nk, scale,
                    HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=is_causal,
                    num_warps=4, num_stages=2)
    return o.view(*lead, Nq, D), lse.view(*lead, Nq)


def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
    is_causal: bool = False, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError("flash_attention_backward is not implemented yet")


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        raise NotImplementedError("flash_attention is not implemented yet")

    @staticmethod
    def backward(ctx, do):
        raise NotImplementedError("flash_attention is not implemented yet")


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    return _FlashAttention.apply(q, k, v, is_causal, scale)
