"""GPU check + side-by-side timing of the GeLU and softmax reference solutions (run on a CUDA machine).

    python scripts/gpu/bench_foundation.py

Prints one table: time, GB/s (bytes read + written once) and ratios against torch native,
torch.compile of the PyTorch formula and a device copy of the same bytes, all timed in this run with
triton.testing.do_bench (median, L2 flushed between repetitions).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from grader import exercises, loader

gelu = loader.load("solutions", exercises.get("gelu")).gelu
softmax = loader.load("solutions", exercises.get("softmax")).softmax


def gelu_formula(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def softmax_formula(x):
    z = x - x.max(dim=-1, keepdim=True).values
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


def ms(fn):
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def main():
    rows = []
    gelu_c = torch.compile(gelu_formula)
    softmax_c = torch.compile(softmax_formula)
    cases = [
        ("gelu", (1 << 26,), torch.float32), ("gelu", (1 << 26,), torch.bfloat16),
        ("gelu", (8192, 8192), torch.float16),
        ("softmax", (4096, 8192), torch.float32), ("softmax", (8192, 4096), torch.bfloat16),
        ("softmax", (4096, 32768), torch.float32), ("softmax", (1024, 65536), torch.float32),
        ("softmax", (32768, 1024), torch.float16),
    ]
    for name, shape, dtype in cases:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        if name == "softmax":
            x = x * 4
        ours = gelu if name == "gelu" else softmax
        native = (lambda x=x: torch.nn.functional.gelu(x, approximate="tanh")) if name == "gelu" else (
            lambda x=x: torch.softmax(x, -1))
        compiled = gelu_c if name == "gelu" else softmax_c
        ref = native()
        got = ours(x)
        err = (got.float() - ref.float()).abs().max().item()
        compiled(x)  # compile outside timing
        nbytes = 2 * x.numel() * x.element_size()
        t = {
            "triton": ms(lambda: ours(x)),
            "torch": ms(native),
            "compile": ms(lambda: compiled(x)),
            "copy": ms(lambda: x.clone()),
        }
        row = {"exercise": name, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "max_err": err,
               **{f"{k}_ms": v for k, v in t.items()},
               "triton_TBps": nbytes / t["triton"] / 1e9, "copy_TBps": nbytes / t["copy"] / 1e9}
        rows.append(row)
        print(f"{name:8} {shape!s:16} {row['dtype']:9} err {err:.1e} | triton {t['triton']:.3f} ms "
              f"{row['triton_TBps']:.2f} TB/s ({t['copy'] / t['triton']:.0%} of copy) | vs torch "
              f"{t['torch'] / t['triton']:.2f}x | vs compile {t['compile'] / t['triton']:.2f}x", flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "bench_foundation.json").write_text(json.dumps({
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
