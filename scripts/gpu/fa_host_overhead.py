"""Host (CPU) overhead of the FlashAttention reference per call vs its GPU time, and a profile.

    PYTHONUNBUFFERED=1 PYTHONPATH=$PWD python3 scripts/gpu/fa_host_overhead.py            # per call + profile
    PYTHONUNBUFFERED=1 PYTHONPATH=$PWD python3 scripts/gpu/fa_host_overhead.py --pieces   # each piece's host cost
"""

from __future__ import annotations

import cProfile
import importlib.util
import io
import pstats
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("fa", ROOT / "solutions/flash_attention/flash_attention.py")
fa = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fa)


def host_us(fn, iters=200) -> float:
    """Wall time per call with tiny inputs (GPU work negligible): the host cost of one call."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e6


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    for b, h, n in ((1, 1, 256), (4, 16, 2048)):
        q, k, v, do = (torch.randn((b, h, n, 64), device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse = fa.flash_attention_forward(q, k, v, is_causal=True)

        def autograd():
            qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
            fa.flash_attention(qg, kg, vg, is_causal=True).backward(do)

        def sdpa_autograd():
            qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do)

        calls = {"forward": lambda: fa.flash_attention_forward(q, k, v, is_causal=True),
                 "backward": lambda: fa.flash_attention_backward(q, k, v, o, lse, do, is_causal=True),
                 "autograd": autograd, "sdpa flash autograd": sdpa_autograd}
        for name, fn in calls.items():
            wall = host_us(fn)
            gpu = do_bench(fn, return_mode="median") * 1e3
            print(f"  b{b}h{h} n{n} {name:20} wall {wall:8.1f} us/call   GPU (do_bench) {gpu:8.1f} us", flush=True)
    # profile the tuned path (b4h16 n2048 is above AUTOTUNE_MIN_WORK); backward called directly, since
    # autograd would run it on its own thread, out of the profiler's sight
    q, k, v, do = (torch.randn((4, 16, 2048, 64), device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = fa.flash_attention_forward(q, k, v, is_causal=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        fa.flash_attention_forward(q, k, v, is_causal=True)
        fa.flash_attention_backward(q, k, v, o, lse, do, is_causal=True)
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue()[:6000])


def pieces() -> None:
    """Host cost of each piece of one backward call, timed in loops without synchronizing."""
    import triton

    q, k, v, do = (torch.randn((1, 1, 256, 64), device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = fa.flash_attention_forward(q, k, v, is_causal=True)
    q3, k3, v3, do3 = (t.view(1, 256, 64) for t in (q, k, v, do))
    dq3 = torch.empty_like(q3)
    lse2 = lse.view(1, 256)
    delta = torch.zeros_like(lse2)
    side = torch.cuda.Stream()
    d = {n: fa._descriptor(t) for n, t in (("q_desc", q3), ("k_desc", k3), ("v_desc", v3), ("do_desc", do3),
                                            ("dq_desc", dq3))}
    fa._set_block_shapes(d, fa._TILES["dq"], 64, 64)
    args = dict(lse_ptr=lse2, delta_ptr=delta, Nq=256, Nk=256, scale=0.125, qk_scale=0.18, SEQ_BUCKET=1024, ELEM_SIZE=2,
                HEAD_DIM=64, CAUSAL=True)

    def stream_ops():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            pass
        main.wait_stream(side)

    tests = {
        "11 x _descriptor()": lambda: [fa._descriptor(q3) for _ in range(11)],
        "stream ops (wait, ctx, wait)": stream_ops,
        "raw dq launch (explicit config)": lambda: fa._attn_bwd_dq[(4, 1)](**d, **args, BLOCK_M=64, BLOCK_N=64,
                                                                            num_warps=4, num_stages=3),
        "tuned dq launch (cached config)": lambda: fa._attn_bwd_dq_tuned[lambda c: (triton.cdiv(256, c["BLOCK_M"]), 1)](
            **d, **args),
        "delta launch": lambda: fa._attn_bwd_delta[(8, 1)](o.view(1, 256, 64), do3, delta, 256 * 64, 64, 1,
                                                             256 * 64, 64, 1, 256, HEAD_DIM=64, BLOCK_M=32),
        "flash_attention_forward": lambda: fa.flash_attention_forward(q, k, v, is_causal=True),
        "flash_attention_backward": lambda: fa.flash_attention_backward(q, k, v, o, lse, do, is_causal=True),
        "torch.empty_like x3": lambda: [torch.empty_like(q) for _ in range(3)],
    }
    for name, fn in tests.items():
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(300):
            fn()
        host = (time.perf_counter() - t) / 300 * 1e6
        torch.cuda.synchronize()
        print(f"  host {name:36} {host:8.1f} us", flush=True)


if __name__ == "__main__":
    import sys

    if "--pieces" in sys.argv:
        pieces()
    else:
        main()
