"""FlashAttention backward experiments (issue 4): tile sweeps and two alternative designs.

    PYTHONUNBUFFERED=1 python3 scripts/gpu/fa_bwd_experiments.py [--quick]

Compares, at the speed-graded shapes and the CS336 leaderboard shape (bf16), the solution's backward
(separate dK/dV and dQ kernels, autotuned) with
  * ``fused``: one launch, program i computes dK/dV of key tile i and then dQ of query tile i (as in
    Triton's fused-attention tutorial): with a causal mask the two halves' work sums to a constant, so
    the programs are balanced;
  * ``atomic``: one dK/dV kernel that also adds each tile's dQ contribution into an fp32 buffer with
    atomics (5 matmuls instead of 7, FA2's design), through pointers or TMA reductions;
  * ``streams``: the two kernels of the solution on two CUDA streams;
and sweeps the raw kernels' tile configurations. Correctness of every variant is checked against a
float32 reference first (also runs in the Triton interpreter on small shapes: TRITON_INTERPRET=1).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def load(impl: str):
    path = (ROOT / impl / "flash_attention" / "flash_attention.py").resolve()
    spec = importlib.util.spec_from_file_location("_fa_experiments", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fa = load("solutions")
_LOG2E = tl.constexpr(1.4426950408889634)
_dkdv_inner = fa._attn_bwd_dkdv_inner
_dq_inner = fa._attn_bwd_dq_inner


# --- variant 1: fused, balanced ---------------------------------------------------------------------


@triton.jit(do_not_specialize=["Nq", "Nk"])
def _bwd_fused(
    q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr,
    Nq, Nk, scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
    BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, CAUSAL: tl.constexpr,
):
    pid = tl.program_id(0)
    off_b = tl.program_id(1).to(tl.int64)
    sq, sk = Nq * HEAD_DIM, Nk * HEAD_DIM  # contiguous (B, N, D)
    lse_ptr += off_b * Nq
    delta_ptr += off_b * Nq
    # dK, dV of key tile pid
    start_n = pid * BLOCK_N1
    if start_n < Nk:
        q_desc = tl.make_tensor_descriptor(q_ptr + off_b * sq, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_M1, HEAD_DIM])
        do_desc = tl.make_tensor_descriptor(do_ptr + off_b * sq, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                            block_shape=[BLOCK_M1, HEAD_DIM])
        kn_desc = tl.make_tensor_descriptor(k_ptr + off_b * sk, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                            block_shape=[BLOCK_N1, HEAD_DIM])
        vn_desc = tl.make_tensor_descriptor(v_ptr + off_b * sk, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                            block_shape=[BLOCK_N1, HEAD_DIM])
        dk_desc = tl.make_tensor_descriptor(dk_ptr + off_b * sk, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                            block_shape=[BLOCK_N1, HEAD_DIM])
        dv_desc = tl.make_tensor_descriptor(dv_ptr + off_b * sk, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                            block_shape=[BLOCK_N1, HEAD_DIM])
        offs_n = start_n + tl.arange(0, BLOCK_N1)
        k = kn_desc.load([start_n, 0])
        v = vn_desc.load([start_n, 0])
        dk = tl.zeros([BLOCK_N1, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N1, HEAD_DIM], tl.float32)
        if CAUSAL:
            dk, dv = _dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, start_n,
                                 tl.minimum(start_n + BLOCK_N1, Nq), offs_n, Nq, qk_scale, BLOCK_M1, True)
            dk, dv = _dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, start_n + BLOCK_N1,
                                 Nq, offs_n, Nq, qk_scale, BLOCK_M1, False)
        else:
            dk, dv = _dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, 0, Nq, offs_n, Nq,
                                 qk_scale, BLOCK_M1, False)
        dv_desc.store([start_n, 0], dv.to(dv_ptr.dtype.element_ty))
        dk_desc.store([start_n, 0], (dk * scale).to(dk_ptr.dtype.element_ty))
    # dQ of query tile pid
    start_m = pid * BLOCK_M2
    if start_m < Nq:
        q2_desc = tl.make_tensor_descriptor(q_ptr + off_b * sq, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                            block_shape=[BLOCK_M2, HEAD_DIM])
        do2_desc = tl.make_tensor_descriptor(do_ptr + off_b * sq, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                             block_shape=[BLOCK_M2, HEAD_DIM])
        dq_desc = tl.make_tensor_descriptor(dq_ptr + off_b * sq, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                            block_shape=[BLOCK_M2, HEAD_DIM])
        k2_desc = tl.make_tensor_descriptor(k_ptr + off_b * sk, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                            block_shape=[BLOCK_N2, HEAD_DIM])
        v2_desc = tl.make_tensor_descriptor(v_ptr + off_b * sk, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                            block_shape=[BLOCK_N2, HEAD_DIM])
        offs_m = start_m + tl.arange(0, BLOCK_M2)
        q = q2_desc.load([start_m, 0])
        do = do2_desc.load([start_m, 0])
        lse = tl.load(lse_ptr + offs_m, mask=offs_m < Nq, other=float("inf")) * _LOG2E
        delta = tl.load(delta_ptr + offs_m, mask=offs_m < Nq, other=0.0)
        dq = tl.zeros([BLOCK_M2, HEAD_DIM], tl.float32)
        if CAUSAL:
            dq = _dq_inner(dq, q, do, lse, delta, k2_desc, v2_desc, 0, start_m, offs_m, Nk, qk_scale,
                           BLOCK_N2, False, False)
            dq = _dq_inner(dq, q, do, lse, delta, k2_desc, v2_desc, start_m, tl.minimum(start_m + BLOCK_M2, Nk),
                           offs_m, Nk, qk_scale, BLOCK_N2, True, True)
        else:
            n_full = (Nk // BLOCK_N2) * BLOCK_N2
            dq = _dq_inner(dq, q, do, lse, delta, k2_desc, v2_desc, 0, n_full, offs_m, Nk, qk_scale,
                           BLOCK_N2, False, False)
            dq = _dq_inner(dq, q, do, lse, delta, k2_desc, v2_desc, n_full, Nk, offs_m, Nk, qk_scale,
                           BLOCK_N2, True, False)
        dq_desc.store([start_m, 0], (dq * scale).to(dq_ptr.dtype.element_ty))


# --- variant 2: dQ by atomics ---------------------------------------------------------------------------


@triton.jit
def _dkdv_dq_inner(
    dk, dv, k, v, q_desc, do_desc, dq_desc, dq_ptr, lse_ptr, delta_ptr,
    lo, hi, offs_n, Nq, Nk, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr, MASK_N: tl.constexpr,
    DESC_ATOMIC: tl.constexpr,
):
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = q_desc.load([start_m, 0])
        lse = tl.load(lse_ptr + offs_m, mask=offs_m < Nq, other=float("inf")) * _LOG2E
        pT = tl.math.exp2(tl.dot(k, q.T) * qk_scale - lse[None, :])
        if CAUSAL:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        if MASK_N:  # keys past Nk: zero rows, but 2^(-lse) may overflow and inf · 0 = NaN in dQ
            pT = tl.where(offs_n[:, None] < Nk, pT, 0.0)
        do = do_desc.load([start_m, 0])
        dv = tl.dot(pT.to(do.dtype), do, dv)
        delta = tl.load(delta_ptr + offs_m, mask=offs_m < Nq, other=0.0)
        dpT = tl.dot(v, do.T)
        dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
        dk = tl.dot(dsT, q, dk)
        dq = tl.dot(dsT.T, k)  # this key tile's share of dQ for these queries, [BLOCK_M, D]
        if DESC_ATOMIC:
            dq_desc.atomic_add([start_m, 0], dq)
        else:
            tl.atomic_add(dq_ptr + offs_m[:, None] * HEAD_DIM + offs_d[None, :], dq, mask=(offs_m < Nq)[:, None],
                          sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=["Nq", "Nk"])
def _bwd_atomic(
    q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr,
    Nq, Nk, scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    MASK_N: tl.constexpr, DESC_ATOMIC: tl.constexpr,
):
    pid = tl.program_id(0)
    if CAUSAL:  # longest first
        pid = tl.num_programs(0) - 1 - pid
    start_n = pid * BLOCK_N
    off_b = tl.program_id(1).to(tl.int64)
    sq, sk = Nq * HEAD_DIM, Nk * HEAD_DIM
    q_desc = tl.make_tensor_descriptor(q_ptr + off_b * sq, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    do_desc = tl.make_tensor_descriptor(do_ptr + off_b * sq, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                        block_shape=[BLOCK_M, HEAD_DIM])
    dq_desc = tl.make_tensor_descriptor(dq_ptr + off_b * sq, shape=[Nq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                        block_shape=[BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(k_ptr + off_b * sk, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(v_ptr + off_b * sk, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    dk_desc = tl.make_tensor_descriptor(dk_ptr + off_b * sk, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                        block_shape=[BLOCK_N, HEAD_DIM])
    dv_desc = tl.make_tensor_descriptor(dv_ptr + off_b * sk, shape=[Nk, HEAD_DIM], strides=[HEAD_DIM, 1],
                                        block_shape=[BLOCK_N, HEAD_DIM])
    lse_ptr += off_b * Nq
    delta_ptr += off_b * Nq
    dq_ptr += off_b * sq
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = k_desc.load([start_n, 0])
    v = v_desc.load([start_n, 0])
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    if CAUSAL:
        dk, dv = _dkdv_dq_inner(dk, dv, k, v, q_desc, do_desc, dq_desc, dq_ptr, lse_ptr, delta_ptr, start_n,
                                tl.minimum(start_n + BLOCK_N, Nq), offs_n, Nq, Nk, qk_scale, HEAD_DIM, BLOCK_M,
                                True, MASK_N, DESC_ATOMIC)
        dk, dv = _dkdv_dq_inner(dk, dv, k, v, q_desc, do_desc, dq_desc, dq_ptr, lse_ptr, delta_ptr,
                                start_n + BLOCK_N, Nq, offs_n, Nq, Nk, qk_scale, HEAD_DIM, BLOCK_M,
                                False, MASK_N, DESC_ATOMIC)
    else:
        dk, dv = _dkdv_dq_inner(dk, dv, k, v, q_desc, do_desc, dq_desc, dq_ptr, lse_ptr, delta_ptr, 0, Nq,
                                offs_n, Nq, Nk, qk_scale, HEAD_DIM, BLOCK_M, False, MASK_N, DESC_ATOMIC)
    dv_desc.store([start_n, 0], dv.to(dv_ptr.dtype.element_ty))
    dk_desc.store([start_n, 0], (dk * scale).to(dk_ptr.dtype.element_ty))


@triton.jit
def _delta_zero(o_ptr, do_ptr, delta_ptr, dq32_ptr, Nq, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Δ = rowsum(dO ∘ O), and zero the fp32 dQ accumulator on the way."""
    off_b = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = (offs_m < Nq)[:, None]
    offs = off_b * Nq * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    o = tl.load(o_ptr + offs, mask=mask).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=mask).to(tl.float32)
    tl.store(delta_ptr + off_b * Nq + offs_m, tl.sum(o * do, axis=1), mask=offs_m < Nq)
    tl.store(dq32_ptr + offs, tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), mask=mask)


@triton.jit
def _scale_cast(src_ptr, dst_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src_ptr + offs, mask=offs < n)
    tl.store(dst_ptr + offs, (x * scale).to(dst_ptr.dtype.element_ty), mask=offs < n)


# --- host side --------------------------------------------------------------------------------------------


def prep(q, o, lse, do):
    b = q.reshape(-1, *q.shape[-2:]).shape[0]
    nq, d = q.shape[-2:]
    delta = torch.empty((b, nq), dtype=torch.float32, device=q.device)
    return b, nq, d, delta


def run_delta(o, do, delta, dq32, b, nq, d):
    block = 32 if INTERPRET else 128
    if dq32 is None:
        fa._attn_bwd_delta[(triton.cdiv(nq, block), b)](o, do, delta, nq * d, d, 1, nq * d, d, 1, nq, HEAD_DIM=d,
                                                        BLOCK_M=block)
    else:
        _delta_zero[(triton.cdiv(nq, block), b)](o, do, delta, dq32, nq, HEAD_DIM=d, BLOCK_M=block)


def bwd_fused(q, k, v, o, lse, do, causal, cfg):
    bm1, bn1, bm2, bn2, warps, stages = cfg
    b, nq, d, delta = prep(q, o, lse, do)
    nk = k.shape[-2]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    run_delta(o, do, delta, None, b, nq, d)
    scale = d**-0.5
    grid = (max(triton.cdiv(nk, bn1), triton.cdiv(nq, bm2)), b)
    _bwd_fused[grid](q, k, v, do, dq, dk, dv, lse, delta, nq, nk, scale, scale * fa.LOG2E, HEAD_DIM=d,
                     BLOCK_M1=bm1, BLOCK_N1=bn1, BLOCK_M2=bm2, BLOCK_N2=bn2, CAUSAL=causal,
                     **({} if INTERPRET else {"num_warps": warps, "num_stages": stages}))
    return dq, dk, dv


def bwd_atomic(q, k, v, o, lse, do, causal, cfg, desc_atomic=False):
    bm, bn, warps, stages = cfg
    b, nq, d, delta = prep(q, o, lse, do)
    nk = k.shape[-2]
    dq32 = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    run_delta(o, do, delta, dq32, b, nq, d)
    scale = d**-0.5
    _bwd_atomic[(triton.cdiv(nk, bn), b)](q, k, v, do, dq32, dk, dv, lse, delta, nq, nk, scale, scale * fa.LOG2E,
                                         HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, MASK_N=nk % bn != 0,
                                         DESC_ATOMIC=desc_atomic,
                                         **({} if INTERPRET else {"num_warps": warps, "num_stages": stages}))
    n = dq32.numel()
    _scale_cast[(triton.cdiv(n, 1024),)](dq32, dq, n, scale, BLOCK=1024)
    return dq, dk, dv


def raw_dkdv(q, k, v, do, dk, dv, lse, delta, causal, cfg):
    bm, bn, warps, stages = cfg
    b = q.reshape(-1, *q.shape[-2:]).shape[0]
    nq, d = q.shape[-2:]
    nk = k.shape[-2]
    scale = d**-0.5
    fa._attn_bwd_dkdv[(triton.cdiv(nk, bn), b)](
        q, k, v, do, dk, dv, lse, delta, nq * d, d, nk * d, d, nk * d, d, nq * d, d, nk * d, d, nk * d, d,
        nq, nk, scale, scale * fa.LOG2E, 0, HEAD_DIM=d, CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn,
        num_warps=warps, num_stages=stages)


def raw_dq(q, k, v, do, dq, lse, delta, causal, cfg):
    bm, bn, warps, stages = cfg
    b = q.reshape(-1, *q.shape[-2:]).shape[0]
    nq, d = q.shape[-2:]
    nk = k.shape[-2]
    scale = d**-0.5
    fa._attn_bwd_dq[(triton.cdiv(nq, bm), b)](
        q, k, v, do, dq, lse, delta, nq * d, d, nk * d, d, nk * d, d, nq * d, d, nq * d, d,
        nq, nk, scale, scale * fa.LOG2E, 0, HEAD_DIM=d, CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn,
        num_warps=warps, num_stages=stages)


def raw_fwd(q, k, v, o, lse, causal, cfg):
    bm, bn, warps, stages = cfg
    b = q.reshape(-1, *q.shape[-2:]).shape[0]
    nq, d = q.shape[-2:]
    nk = k.shape[-2]
    fa._attn_fwd[(triton.cdiv(nq, bm), b)](
        q, k, v, o, lse, nq * d, d, nk * d, d, nk * d, d, nq * d, d, nq, nk, d**-0.5 * fa.LOG2E, 0,
        HEAD_DIM=d, CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)


def bwd_streams(q, k, v, o, lse, do, causal, streams):
    """The solution's kernels (autotuned configs) with dK/dV and dQ on two streams."""
    b, nq, d, delta = prep(q, o, lse, do)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    run_delta(o, do, delta, None, b, nq, d)
    cur = torch.cuda.current_stream()
    s1, s2 = streams
    s1.wait_stream(cur)
    s2.wait_stream(cur)
    with torch.cuda.stream(s1):
        raw_dkdv(q, k, v, do, dk, dv, lse, delta, causal, BEST["dkdv"])
    with torch.cuda.stream(s2):
        raw_dq(q, k, v, do, dq, lse, delta, causal, BEST["dq"])
    cur.wait_stream(s1)
    cur.wait_stream(s2)
    return dq, dk, dv


BEST = {"dkdv": (32, 128, 4, 5), "dq": (128, 32, 4, 5)}


def reference(q, k, v, do, causal):
    q, k, v = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    (torch.softmax(s, dim=-1) @ v).backward(do.float())
    return q.grad, k.grad, v.grad


def check(name, fn, dtype, shapes) -> bool:
    ok = True
    g = torch.Generator(device=DEVICE).manual_seed(1)
    for b, h, nq, nk, d, causal in shapes:
        q = torch.randn((b, h, nq, d), device=DEVICE, generator=g).to(dtype)
        k, v = (torch.randn((b, h, nk, d), device=DEVICE, generator=g).to(dtype) for _ in range(2))
        do = torch.randn((b, h, nq, d), device=DEVICE, generator=g).to(dtype)
        o, lse = fa.flash_attention_forward(q, k, v, is_causal=causal)
        got = fn(q, k, v, o, lse, do, causal)
        refs = reference(q, k, v, do, causal)
        errs = [float((x.float() - r).abs().max() / r.abs().max()) for x, r in zip(got, refs)]
        good = all(e < (2e-2 if dtype == torch.bfloat16 else 5e-3) for e in errs)
        ok &= good
        log(f"  {'ok  ' if good else 'FAIL'} {name:28} {str(dtype)[6:]:8} {(b, h, nq, nk, d, causal)} "
            f"dq/dk/dv err {errs[0]:.1e} {errs[1]:.1e} {errs[2]:.1e}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not INTERPRET:
        triton.set_allocator(fa._tma_scratch)
        log(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    has_desc_atomic = hasattr(tl.tensor_descriptor, "atomic_add")
    log(f"tensor_descriptor.atomic_add available: {has_desc_atomic}")

    small = [(1, 2, 100, 100, 64, True), (1, 2, 77, 130, 32, False)] if INTERPRET else [
        (2, 3, 1000, 1000, 64, True), (1, 4, 777, 1025, 128, False), (2, 2, 3001, 3001, 128, True),
        (1, 2, 1, 300, 64, False)]
    fused_cfg = (16, 32, 32, 16, 4, 1) if INTERPRET else (32, 128, 128, 32, 4, 5)
    atomic_cfg = (16, 32, 4, 1) if INTERPRET else (64, 128, 8, 3)
    variants = {
        "fused": lambda *a: bwd_fused(*a, fused_cfg),
        "atomic-ptr": lambda *a: bwd_atomic(*a, atomic_cfg),
    }
    if has_desc_atomic:
        variants["atomic-desc"] = lambda *a: bwd_atomic(*a, atomic_cfg, desc_atomic=True)
    dtypes = (torch.float32,) if INTERPRET else (torch.bfloat16, torch.float16)
    correct = {}
    for name, fn in variants.items():
        try:
            correct[name] = all(check(name, fn, dt, small) for dt in dtypes)
        except Exception as exc:
            correct[name] = False
            log(f"  FAIL {name}: {type(exc).__name__}: {str(exc)[:300]}")
    if INTERPRET:
        return

    from triton.testing import do_bench

    def bench(fn):
        return do_bench(fn, warmup=10, rep=60 if args.quick else 100, return_mode="median")

    shapes = [("cs336 b1h16 n16384 d64 causal", 1, 16, 16384, 64, True),
              ("b4h16 n2048 d64 causal", 4, 16, 2048, 64, True),
              ("b2h16 n4096 d128 causal", 2, 16, 4096, 128, True),
              ("b2h16 n4096 d128", 2, 16, 4096, 128, False),
              ("b1h32 n16384 d64", 1, 32, 16384, 64, False)]
    dkdv_cfgs = {64: [(32, 128, 4, 5), (32, 128, 4, 4), (32, 128, 4, 3), (64, 128, 8, 3), (64, 128, 4, 3),
                      (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 3), (16, 128, 4, 5), (128, 128, 8, 2)],
                 128: [(32, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 2), (32, 128, 4, 3),
                       (64, 128, 8, 3), (16, 128, 8, 3), (32, 64, 4, 4)]}
    dq_cfgs = {64: [(128, 32, 4, 5), (128, 64, 8, 3), (64, 32, 4, 3), (64, 64, 4, 3), (128, 64, 4, 3),
                    (128, 32, 4, 4), (128, 128, 8, 2), (128, 16, 4, 5), (256, 64, 8, 3)],
               128: [(128, 32, 8, 3), (128, 64, 8, 2), (64, 32, 4, 3), (64, 64, 4, 2), (128, 32, 4, 3),
                     (128, 64, 8, 3), (128, 16, 4, 4)]}
    fwd_cfgs = {64: [(128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 8, 3), (128, 128, 4, 3), (128, 64, 8, 3),
                     (256, 64, 8, 3), (128, 128, 8, 4), (64, 64, 4, 3)],
                128: [(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 4, 2),
                      (256, 64, 8, 2)]}
    fused_cfgs = {64: [(32, 128, 128, 32, 4, 5), (64, 128, 128, 64, 8, 3), (32, 128, 128, 32, 4, 3),
                       (64, 128, 128, 32, 8, 3)],
                  128: [(32, 128, 128, 32, 8, 3), (64, 128, 128, 64, 8, 2), (32, 64, 64, 32, 4, 3)]}
    atomic_cfgs = {64: [(64, 128, 8, 3), (32, 128, 4, 3), (64, 128, 8, 2), (64, 64, 4, 3), (128, 128, 8, 2),
                        (32, 128, 8, 3)],
                   128: [(64, 128, 8, 2), (32, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3)]}
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    for label, b, h, n, d, causal in shapes[:3] if args.quick else shapes:
        g = torch.Generator(device="cuda").manual_seed(n)
        q, k, v, do = (torch.randn((b, h, n, d), device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
        o, lse = fa.flash_attention_forward(q, k, v, is_causal=causal)
        fl = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
        log(f"== {label}: forward {fl / 1e12:.2f} TFLOP, backward {2.5 * fl / 1e12:.2f} TFLOP")
        res = {}
        res["fwd solution"] = bench(lambda: fa.flash_attention_forward(q, k, v, is_causal=causal))
        res["bwd solution"] = bench(lambda: fa.flash_attention_backward(q, k, v, o, lse, do, is_causal=causal))
        b3, nq, _, delta = prep(q, o, lse, do)
        run_delta(o, do, delta, None, b3, nq, d)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        res["delta only"] = bench(lambda: run_delta(o, do, delta, None, b3, nq, d))
        o2, lse2 = torch.empty_like(o), torch.empty_like(lse)
        for kind, cfgs, call in (
            ("fwd", fwd_cfgs[d], lambda c: raw_fwd(q, k, v, o2, lse2, causal, c)),
            ("dkdv", dkdv_cfgs[d], lambda c: raw_dkdv(q, k, v, do, dk, dv, lse, delta, causal, c)),
            ("dq", dq_cfgs[d], lambda c: raw_dq(q, k, v, do, dq, lse, delta, causal, c)),
            ("fused", fused_cfgs[d], lambda c: bwd_fused(q, k, v, o, lse, do, causal, c)),
            ("atomic-ptr", atomic_cfgs[d], lambda c: bwd_atomic(q, k, v, o, lse, do, causal, c)),
            ("atomic-desc", atomic_cfgs[d] if has_desc_atomic else [],
             lambda c: bwd_atomic(q, k, v, o, lse, do, causal, c, desc_atomic=True)),
        ):
            if kind in correct and not correct[kind]:
                continue
            best = None
            for c in cfgs:
                try:
                    t = bench(lambda c=c: call(c))
                except Exception as exc:
                    log(f"  {kind} {c}: {type(exc).__name__} {str(exc)[:100]}")
                    continue
                res[f"{kind} {c}"] = t
                if best is None or t < best[0]:
                    best = (t, c)
            if best and kind in BEST:
                BEST[kind] = best[1]
        res["bwd streams (best dkdv/dq)"] = bench(lambda: bwd_streams(q, k, v, o, lse, do, causal, streams))
        for key, t in res.items():
            mult = 1.0 if key.startswith(("fwd", "delta")) else 2.5
            print(f"    {key:44} {t:8.3f} ms {mult * fl / t / 1e9:7.0f} TFLOP/s", flush=True)
        split = res[f"dkdv {BEST['dkdv']}"] + res[f"dq {BEST['dq']}"] + res["delta only"]
        log(f"  best dkdv {BEST['dkdv']}, dq {BEST['dq']}: delta + dkdv + dq = {split:.3f} ms")
        torch.cuda.empty_cache()
        BEST.update({"dkdv": (32, 128, 4, 5), "dq": (128, 32, 4, 5)})
    log("done")


if __name__ == "__main__":
    main()
