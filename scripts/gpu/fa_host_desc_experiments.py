"""FlashAttention experiments, part 2 (issue 4): host-side 3-D tensor descriptors instead of
device-side ``tl.make_tensor_descriptor`` (which writes a 128-byte descriptor to global memory and
fences it in every program), warp specialization of the forward loop, and dK/dV ‖ dQ on two streams
with the configurations re-tuned for running side by side.

    PYTHONUNBUFFERED=1 python3 scripts/gpu/fa_host_desc_experiments.py
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

ROOT = Path(__file__).resolve().parents[2]
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
T0 = time.time()
_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def load(impl: str):
    path = (ROOT / impl / "flash_attention" / "flash_attention.py").resolve()
    spec = importlib.util.spec_from_file_location("_fa_experiments2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fa = load("solutions")


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, off_b, lo, hi, offs_m, Nk, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
               WS: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = k_desc.load([off_b, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, k.T)
        if MASK:
            keep = (start_n + offs_n)[None, :] < Nk
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= (start_n + offs_n)[None, :])
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([off_b, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["Nq", "Nk"])
def _fwd_host(q_desc, k_desc, v_desc, o_desc, lse_ptr, Nq, Nk, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              WS: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    off_b = tl.program_id(1)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    q = q_desc.load([off_b, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    if CAUSAL:
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, off_b, 0, start_m, offs_m, Nk, qk_scale,
                                   HEAD_DIM, BLOCK_N, False, False, WS)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, off_b, start_m,
                                   tl.minimum(start_m + BLOCK_M, Nk), offs_m, Nk, qk_scale,
                                   HEAD_DIM, BLOCK_N, True, True, WS)
    else:
        n_full = (Nk // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, off_b, 0, n_full, offs_m, Nk, qk_scale,
                                   HEAD_DIM, BLOCK_N, False, False, WS)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_desc, v_desc, off_b, n_full, Nk, offs_m, Nk, qk_scale,
                                   HEAD_DIM, BLOCK_N, True, False, WS)
    tl.store(lse_ptr + off_b.to(tl.int64) * Nq + offs_m, (m_i + tl.math.log2(l_i)) * _LN2, mask=offs_m < Nq)
    o_desc.store([off_b, start_m, 0], (acc / l_i[:, None]).to(o_desc.dtype).reshape(1, BLOCK_M, HEAD_DIM))


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, off_b, lo, hi, offs_n, Nq, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = q_desc.load([off_b, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        lse = tl.load(lse_ptr + offs_m, mask=offs_m < Nq, other=float("inf")) * _LOG2E
        pT = tl.math.exp2(tl.dot(k, q.T) * qk_scale - lse[None, :])
        if CAUSAL:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        do = do_desc.load([off_b, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        dv = tl.dot(pT.to(do.dtype), do, dv)
        delta = tl.load(delta_ptr + offs_m, mask=offs_m < Nq, other=0.0)
        dpT = tl.dot(v, do.T)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk)
    return dk, dv


@triton.jit(do_not_specialize=["Nq", "Nk"])
def _dkdv_host(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_ptr, delta_ptr, Nq, Nk, scale, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    off_b = tl.program_id(1)
    lse_ptr += off_b.to(tl.int64) * Nq
    delta_ptr += off_b.to(tl.int64) * Nq
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = k_desc.load([off_b, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    v = v_desc.load([off_b, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    if CAUSAL:
        dk, dv = _dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, off_b, start_n,
                             tl.minimum(start_n + BLOCK_N, Nq), offs_n, Nq, qk_scale, HEAD_DIM, BLOCK_M, True)
        dk, dv = _dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, off_b, start_n + BLOCK_N, Nq,
                             offs_n, Nq, qk_scale, HEAD_DIM, BLOCK_M, False)
    else:
        dk, dv = _dkdv_inner(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, off_b, 0, Nq, offs_n, Nq,
                             qk_scale, HEAD_DIM, BLOCK_M, False)
    dv_desc.store([off_b, start_n, 0], dv.to(dv_desc.dtype).reshape(1, BLOCK_N, HEAD_DIM))
    dk_desc.store([off_b, start_n, 0], (dk * scale).to(dk_desc.dtype).reshape(1, BLOCK_N, HEAD_DIM))


def desc(t, block):
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, block, t.shape[-1]])


def fwd_host(q, k, v, causal, cfg, ws=False):
    bm, bn, warps, stages = cfg
    b, nq, d = q.shape
    nk = k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty((b, nq), dtype=torch.float32, device=q.device)
    extra = {} if INTERPRET else {"num_warps": warps, "num_stages": stages}
    _fwd_host[(triton.cdiv(nq, bm), b)](desc(q, bm), desc(k, bn), desc(v, bn), desc(o, bm), lse, nq, nk,
                                       d**-0.5 * fa.LOG2E, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal,
                                       WS=ws, **extra)
    return o, lse


def dkdv_host(q, k, v, do, lse, delta, dk, dv, causal, cfg):
    bm, bn, warps, stages = cfg
    b, nq, d = q.shape
    nk = k.shape[1]
    extra = {} if INTERPRET else {"num_warps": warps, "num_stages": stages}
    _dkdv_host[(triton.cdiv(nk, bn), b)](desc(q, bm), desc(k, bn), desc(v, bn), desc(do, bm), desc(dk, bn),
                                        desc(dv, bn), lse, delta, nq, nk, d**-0.5, d**-0.5 * fa.LOG2E,
                                        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, **extra)


def raw_dkdv(q, k, v, do, dk, dv, lse, delta, causal, cfg):
    bm, bn, warps, stages = cfg
    b, nq, d = q.shape
    nk = k.shape[1]
    scale = d**-0.5
    fa._attn_bwd_dkdv[(triton.cdiv(nk, bn), b)](
        q, k, v, do, dk, dv, lse, delta, nq * d, d, nk * d, d, nk * d, d, nq * d, d, nk * d, d, nk * d, d,
        nq, nk, scale, scale * fa.LOG2E, 0, HEAD_DIM=d, CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn,
        num_warps=warps, num_stages=stages)


def raw_dq(q, k, v, do, dq, lse, delta, causal, cfg):
    bm, bn, warps, stages = cfg
    b, nq, d = q.shape
    nk = k.shape[1]
    scale = d**-0.5
    fa._attn_bwd_dq[(triton.cdiv(nq, bm), b)](
        q, k, v, do, dq, lse, delta, nq * d, d, nk * d, d, nk * d, d, nq * d, d, nq * d, d,
        nq, nk, scale, scale * fa.LOG2E, 0, HEAD_DIM=d, CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn,
        num_warps=warps, num_stages=stages)


def raw_fwd(q, k, v, o, lse, causal, cfg):
    bm, bn, warps, stages = cfg
    b, nq, d = q.shape
    nk = k.shape[1]
    fa._attn_fwd[(triton.cdiv(nq, bm), b)](
        q, k, v, o, lse, nq * d, d, nk * d, d, nk * d, d, nq * d, d, nq, nk, d**-0.5 * fa.LOG2E, 0,
        HEAD_DIM=d, CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)


def main() -> None:
    if INTERPRET:
        g = torch.Generator().manual_seed(0)
        for b, n, m, d, causal in [(2, 100, 100, 64, True), (3, 77, 130, 32, False)]:
            q = torch.randn((b, n, d), generator=g)
            k, v = torch.randn((b, m, d), generator=g), torch.randn((b, m, d), generator=g)
            o, lse = fwd_host(q, k, v, causal, (32, 16, 4, 1))
            o_ref, lse_ref = fa.flash_attention_forward(q, k, v, is_causal=causal)
            do = torch.randn_like(q)
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            delta = (o_ref * do).sum(-1)
            dkdv_host(q, k, v, do, lse_ref, delta, dk, dv, causal, (16, 32, 4, 1))
            _, dk_ref, dv_ref = fa.flash_attention_backward(q, k, v, o_ref, lse_ref, do, is_causal=causal)
            log(f"interpreter: o {float((o - o_ref).abs().max()):.1e} lse {float((lse - lse_ref).abs().max()):.1e} "
                f"dk {float((dk - dk_ref).abs().max()):.1e} dv {float((dv - dv_ref).abs().max()):.1e}")
        return

    from triton.testing import do_bench

    triton.set_allocator(fa._tma_scratch)
    log(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")

    def bench(fn):
        return do_bench(fn, warmup=10, rep=60, return_mode="median")

    g = torch.Generator(device="cuda").manual_seed(0)
    # correctness of the host-descriptor kernels against the solution (bf16, awkward sizes)
    for b, n, m, d, causal in [(6, 1000, 1000, 64, True), (4, 777, 1025, 128, False), (4, 3001, 3001, 128, True)]:
        q = torch.randn((b, n, d), device="cuda", generator=g, dtype=torch.bfloat16)
        k, v = (torch.randn((b, m, d), device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn_like(q)
        o_ref, lse_ref = fa.flash_attention_forward(q, k, v, is_causal=causal)
        _, dk_ref, dv_ref = fa.flash_attention_backward(q, k, v, o_ref, lse_ref, do, is_causal=causal)
        delta = (o_ref.float() * do.float()).sum(-1)
        for ws in (False, True):
            try:
                o, lse = fwd_host(q, k, v, causal, (128, 64, 4, 3), ws=ws)
                err = float((o.float() - o_ref.float()).abs().max())
                log(f"  fwd host ws={ws} {(b, n, m, d, causal)}: o {err:.1e} "
                    f"lse {float((lse - lse_ref).abs().max()):.1e}")
            except Exception as exc:
                log(f"  fwd host ws={ws}: {type(exc).__name__}: {str(exc)[:200]}")
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        dkdv_host(q, k, v, do, lse_ref, delta, dk, dv, causal, (32, 64, 4, 3))
        log(f"  dkdv host: dk {float((dk.float() - dk_ref.float()).abs().max() / dk_ref.float().abs().max()):.1e} "
            f"dv {float((dv.float() - dv_ref.float()).abs().max() / dv_ref.float().abs().max()):.1e}")

    shapes = [("b16h32 n1024 d64 causal", 16, 32, 1024, 64, True), ("b16h32 n1024 d64", 16, 32, 1024, 64, False),
              ("b4h16 n2048 d64 causal", 4, 16, 2048, 64, True),
              ("cs336 b1h16 n16384 d64 causal", 1, 16, 16384, 64, True),
              ("b16h16 n1024 d128 causal", 16, 16, 1024, 128, True),
              ("b2h16 n4096 d128 causal", 2, 16, 4096, 128, True)]
    fwd_cfgs = {64: [(128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3), (128, 128, 4, 3), (64, 32, 4, 4)],
                128: [(128, 64, 4, 2), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3)]}
    dkdv_cfgs = {64: [(32, 128, 4, 3), (32, 64, 4, 3), (64, 64, 4, 3)], 128: [(64, 64, 4, 2), (32, 64, 4, 3)]}
    pairs = {64: [((32, 128, 4, 3), (128, 64, 8, 3)), ((32, 128, 4, 3), (64, 64, 4, 3)),
                  ((32, 128, 4, 3), (128, 32, 4, 5)), ((32, 64, 4, 3), (64, 64, 4, 3)),
                  ((32, 128, 4, 3), (128, 64, 4, 3))],
             128: [((64, 64, 4, 2), (128, 64, 8, 3)), ((64, 64, 4, 2), (64, 32, 4, 3)),
                   ((32, 64, 4, 3), (64, 32, 4, 3)), ((64, 64, 4, 2), (128, 32, 8, 3))]}
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for label, b, h, n, d, causal in shapes:
        q, k, v, do = (torch.randn((b * h, n, d), device="cuda", generator=g, dtype=torch.bfloat16)
                       for _ in range(4))
        o, lse = fa.flash_attention_forward(q, k, v, is_causal=causal)
        delta = (o.float() * do.float()).sum(-1)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        fl = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
        log(f"== {label}")
        res = {"fwd solution (autotuned)": (bench(lambda: fa.flash_attention_forward(q, k, v, is_causal=causal)), 1)}
        o2, lse2 = torch.empty_like(o), torch.empty_like(lse)
        for c in fwd_cfgs[d]:
            res[f"fwd device-desc {c}"] = (bench(lambda c=c: raw_fwd(q, k, v, o2, lse2, causal, c)), 1)
            res[f"fwd host-desc   {c}"] = (bench(lambda c=c: fwd_host(q, k, v, causal, c)), 1)
            try:
                res[f"fwd host-desc ws {c}"] = (bench(lambda c=c: fwd_host(q, k, v, causal, c, ws=True)), 1)
            except Exception as exc:
                log(f"  ws {c}: {type(exc).__name__}: {str(exc)[:120]}")
        for c in dkdv_cfgs[d]:
            res[f"dkdv device-desc {c}"] = (bench(lambda c=c: raw_dkdv(q, k, v, do, dk, dv, lse, delta, causal, c)),
                                            4 / 7 * 2.5)
            res[f"dkdv host-desc   {c}"] = (bench(lambda c=c: dkdv_host(q, k, v, do, lse, delta, dk, dv, causal, c)),
                                            4 / 7 * 2.5)
        res["bwd solution (autotuned)"] = (bench(lambda: fa.flash_attention_backward(q, k, v, o, lse, do,
                                                                                        is_causal=causal)), 2.5)
        for c1, c2 in pairs[d]:
            def both(c1=c1, c2=c2):
                cur = torch.cuda.current_stream()
                s1.wait_stream(cur)
                s2.wait_stream(cur)
                with torch.cuda.stream(s1):
                    raw_dkdv(q, k, v, do, dk, dv, lse, delta, causal, c1)
                with torch.cuda.stream(s2):
                    raw_dq(q, k, v, do, dq, lse, delta, causal, c2)
                cur.wait_stream(s1)
                cur.wait_stream(s2)
            res[f"streams dkdv {c1} || dq {c2}"] = (bench(both), 2.5)
        for key, (t, mult) in res.items():
            print(f"    {key:52} {t:8.3f} ms {mult * fl / t / 1e9:7.0f} TFLOP/s", flush=True)
    log("done")


if __name__ == "__main__":
    main()
