"""The malformed calls FlashAttention's forward and backward must refuse with an error that names the problem:
mismatched shapes, an unsupported head dimension, a causal call with Nq ≠ Nk, mixed dtypes, a tensor on the wrong
device, an lse that is not float32.
"""

from __future__ import annotations

import torch

from grader.checks import tensors
from grader.checks.spec import BadInput


def _randn(*shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    return torch.randn(shape, generator=tensors.generator(len(shape)), dtype=torch.float32).to(dtype).to(device)


def _bad(label: str, match: str, q, k, v, raises=(ValueError, TypeError), **kwargs) -> BadInput:
    def make_args(device: str):
        return (_randn(*q, device=device), _randn(*k, device=device), _randn(*v, device=device)), kwargs

    return BadInput(label, "flash_attention_forward", make_args, raises, match)


def _mixed_dtypes(device: str):
    return (_randn(2, 8, 16, dtype=torch.float16, device=device), _randn(2, 8, 16, device=device),
            _randn(2, 8, 16, device=device)), {}


def _wrong_device(device: str):
    """On a CUDA run: CPU tensors. (On a CPU run with a GPU present: q on the GPU, k and v on the CPU.)"""
    q = _randn(2, 8, 16)
    return ((q, _randn(2, 8, 16), _randn(2, 8, 16)) if device == "cuda" else (q.cuda(), _randn(2, 8, 16),
            _randn(2, 8, 16))), {}


FORWARD_BAD_INPUTS = (
    _bad("leading-dims-differ", r"lead|batch|head|shape|dim", (2, 3, 8, 16), (2, 4, 8, 16), (2, 4, 8, 16)),
    _bad("head-dim-differs", r"head|\bD\b|dim|shape", (2, 8, 16), (2, 8, 32), (2, 8, 32)),
    _bad("head-dim-48", r"48|head|\bD\b|dim", (2, 8, 48), (2, 8, 48), (2, 8, 48)),
    _bad("head-dim-256", r"256|head|\bD\b|dim", (2, 8, 256), (2, 8, 256), (2, 8, 256)),
    _bad("k-v-lengths-differ", r"\bk\b|\bv\b|key|length|shape", (2, 8, 16), (2, 9, 16), (2, 10, 16)),
    _bad("causal-needs-nq-eq-nk", r"causal|Nq|Nk|square|length", (2, 8, 16), (2, 12, 16), (2, 12, 16),
         is_causal=True),
    BadInput("dtype-mismatch", "flash_attention_forward", _mixed_dtypes, (TypeError, ValueError), r"dtype|float"),
) + ((BadInput("wrong-device", "flash_attention_forward", _wrong_device, (ValueError, TypeError),
               r"cpu|cuda|gpu|device"),) if torch.cuda.is_available() else ())  # only where a GPU exists


def _backward_args(lse_dtype=torch.float32, do_rows=8):
    def make_args(device: str):
        q, k, v = (_randn(2, 8, 16, device=device) for _ in range(3))
        o, do = _randn(2, 8, 16, device=device), _randn(2, do_rows, 16, device=device)
        lse = _randn(2, 8, device=device).to(lse_dtype)
        return (q, k, v, o, lse, do), {}

    return make_args


BACKWARD_BAD_INPUTS = (
    BadInput("lse-not-float32", "flash_attention_backward", _backward_args(lse_dtype=torch.float16),
             (TypeError, ValueError), r"lse|dtype|float32"),
    BadInput("do-shape", "flash_attention_backward", _backward_args(do_rows=9), (ValueError,), r"do|shape"),
)
