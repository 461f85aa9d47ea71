"""The GPU's measured roofs for the roofline: device copy bandwidth and dense matmul throughput, each measured
once per process with ``triton.testing.do_bench``."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any


@cache
def copy_bandwidth_gbps() -> float:
    """Device-to-device copy bandwidth (bytes read + written), 1 GiB, ``do_bench`` median."""
    import torch
    from triton.testing import do_bench

    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


@cache
def matmul_tflops(dtype: str) -> float:
    """Dense 8192³ ``torch.matmul`` rate for ``dtype`` (float32 with TF32, as ``tl.dot`` uses)."""
    import torch
    from triton.testing import do_bench

    from grader.checks.spec import DTYPES

    n = 8192
    a = torch.randn(n, n, device="cuda").to(DTYPES[dtype])
    b = torch.randn(n, n, device="cuda").to(DTYPES[dtype])
    was = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        ms = do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was
    return 2 * n**3 / (ms * 1e-3) / 1e12


def roofline(dtypes: Sequence[str] = ()) -> dict[str, Any]:
    """The measured roofs: copy bandwidth and, for each dtype, the matmul rate (cached per process)."""
    return {
        "copy_gbps": copy_bandwidth_gbps(),
        "matmul_tflops": {d: matmul_tflops(d) for d in sorted(set(dtypes))},
    }
