"""Tiled matrix multiplication with an optional fused GeLU epilogue.

    c = activation(a @ b)      a: (M, K), b: (K, N), activation None or "gelu" (the tanh GeLU)

fp32 accumulation, output in the input dtype, any M, N, K ≥ 1, any strides (transposed inputs).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch

from grader.checks import strategies, tensors
from grader.checks.spec import BadInput, Benchmark, Case, Exercise, Part, Tolerances
from grader.exercises.gelu import gelu_reference

if TYPE_CHECKING:
    from hypothesis import strategies as st

ACTIVATIONS = (None, "gelu")
BF16_DOT_SKIP = "bf16 tl.dot is wrong in the Triton interpreter; runs on the GPU only"


def make_inputs(case: Case) -> dict:
    """a ~ N(0, 1) and b ~ N(0, 1/K) (the usual 1/√fan-in scale), so every c = a @ b is ~N(0, 1)
    whatever K: one absolute tolerance fits all sizes, and GeLU sees the range where it bends."""
    g = tensors.generator(case.seed)
    M, N, K = case["M"], case["N"], case["K"]
    a = tensors.values((M, K), "normal", g)
    b = tensors.over(tensors.values((K, N), "normal", g), math.sqrt(K))
    return {
        "a": tensors.layout_view(a.to(case.dtype), case["layout_a"]),
        "b": tensors.layout_view(b.to(case.dtype), case["layout_b"]),
        "activation": case["activation"],
    }


def call(module, inputs: dict) -> dict:
    return {"c": module.matmul(inputs["a"], inputs["b"], activation=inputs["activation"])}


def reference(inputs: dict) -> dict:
    c = inputs["a"].to(torch.float64) @ inputs["b"].to(torch.float64)
    if inputs["activation"] == "gelu":
        c = gelu_reference(c)
    return {"c": c}


def skip(case: Case, device: str) -> str | None:
    if device != "cuda" and case["dtype"] == "bfloat16":
        return BF16_DOT_SKIP
    return None


def cases(device: str) -> st.SearchStrategy[Case]:
    from hypothesis import strategies as st

    # The interpreter runs tl.dot tile by tile in numpy: keep CPU sizes small.
    max_mn, max_k = (512, 1024) if device == "cuda" else (160, 300)
    dtypes = strategies.DTYPE_NAMES if device == "cuda" else ("float32", "float16")
    return st.builds(
        lambda m, n, k, dtype, la, lb, act, seed: Case(
            {"M": m, "N": n, "K": k, "dtype": dtype, "layout_a": la, "layout_b": lb, "activation": act}, seed
        ),
        strategies.sizes(max_mn),
        strategies.sizes(max_mn),
        strategies.sizes(max_k),
        st.sampled_from(dtypes),
        strategies.layouts(),
        strategies.layouts(),
        st.sampled_from(ACTIVATIONS),
        strategies.seeds(),
    )


def _case(M, N, K, dtype="float32", layout_a="contiguous", layout_b="contiguous", activation=None, seed=0) -> Case:
    return Case(
        {"M": M, "N": N, "K": K, "dtype": dtype, "layout_a": layout_a, "layout_b": layout_b,
         "activation": activation},
        seed,
    )


EXAMPLES = (
    _case(1, 1, 1),  # the smallest problem: every block is mostly padding
    _case(17, 33, 65),  # one past a block boundary in every dimension
    # b transposed: loads past K in B's rows and A's columns land on real numbers (the next column /
    # row), so a missing K mask changes the result instead of reading zeros.
    _case(70, 90, 77, layout_b="transposed"),
    _case(130, 70, 200, layout_a="transposed", activation="gelu"),
    _case(5, 7, 3, "float16", "strided", "offset"),  # K smaller than any tl.dot block (≥ 16)
    _case(64, 48, 1100, "float16", activation="gelu"),  # long K: fp16 partial sums would drift
    _case(96, 80, 1500, "float16", "transposed", "transposed"),
    _case(33, 65, 129, "bfloat16", layout_b="transposed"),
    _case(128, 128, 256, "bfloat16", activation="gelu"),
)

# |c| ~ 1 by construction (see make_inputs), so the absolute part of each tolerance is an error
# relative to the typical size of c.
# * fp32 in the interpreter: tl.dot is an exact fp32 numpy matmul; the only error is fp32
#   accumulation over K (~1e-7·√K): 1e-5 leaves a wide margin and still sees an erf-for-tanh GeLU
#   (up to 4.7e-4 off).
# * fp32 on CUDA: tl.dot rounds (or truncates) both operands to TF32 — a 10-bit mantissa, relative
#   error up to 2^-11 (2^-10 truncated) each. Summed over K products that is ~4e-4·|c| typical
#   (random part) plus up to ~1e-3·|c| systematic if truncated; 5e-3 covers the tail over ~10^6
#   elements. Use fp16 cases to see small epilogue errors on the GPU.
# * fp16/bf16: products of fp16/bf16 numbers are exact in fp32, accumulation is fp32, and the result
#   is rounded once: half an ulp is 4.9e-4 (fp16) / 3.9e-3 (bf16) relative — torch.testing's rtol
#   defaults. atol 1e-4 covers fp32 accumulation over K ≤ ~1500 near c = 0. fp16 accumulation
#   (errors ~1e-3 at K = 1100) and an erf GeLU (4.7e-4 at c ≈ -2.7, where gelu(c) ≈ -0.009) fail.
TOLERANCES = Tolerances(
    (torch.float32, 1e-5, 1e-5),
    (torch.float16, 1e-4, 1e-3),
    (torch.bfloat16, 1e-4, 1.6e-2),
    cuda=[(torch.float32, 5e-3, 5e-3)],
)


def _bad(label: str, make, match: str) -> BadInput:
    return BadInput(label, "matmul", make, raises=(ValueError,), match=match)


def _mat(*shape: int, device: str, dtype=torch.float32) -> torch.Tensor:
    return torch.ones(shape, dtype=dtype, device=device)


BAD_INPUTS = (
    _bad("unknown activation", lambda d: ((_mat(4, 5, device=d), _mat(5, 3, device=d)), {"activation": "relu"}),
         "activation"),
    _bad("inner dimensions differ", lambda d: ((_mat(4, 5, device=d), _mat(6, 3, device=d)), {}),
         r"inner|shape|dimension"),
    _bad("a is 1-D", lambda d: ((_mat(5, device=d), _mat(5, 3, device=d)), {}), r"2-?D|two-dim|matri"),
    _bad("b is 3-D", lambda d: ((_mat(4, 5, device=d), _mat(2, 5, 3, device=d)), {}), r"2-?D|two-dim|matri"),
    _bad("dtypes differ", lambda d: ((_mat(4, 5, device=d, dtype=torch.float16), _mat(5, 3, device=d)), {}),
         "dtype"),
)


# --- speed (GPU): sizes for an H100/H200 and the PyTorch baselines --------------------------------


def _torch_matmul(a: torch.Tensor, b: torch.Tensor, activation: str | None) -> torch.Tensor:
    c = torch.matmul(a, b)
    return torch.nn.functional.gelu(c, approximate="tanh") if activation == "gelu" else c


@functools.cache
def _compiled_matmul():
    # Static shapes give the fastest kernels; each (shape, dtype, grad mode) is then its own graph,
    # more than dynamo's default limit of 8 recompiles (after which it silently runs eager).
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # torch < 2.7
    setattr(cfg, name, max(getattr(cfg, name), 64))
    return torch.compile(_torch_matmul, dynamic=False)


def _flops(inputs: dict) -> float:
    (M, K), N = inputs["a"].shape, inputs["b"].shape[1]
    return 2.0 * M * N * K


def _bytes(inputs: dict) -> float:
    (M, K), N = inputs["a"].shape, inputs["b"].shape[1]
    return float((M * K + K * N + M * N) * inputs["a"].element_size())


BENCHMARKS = tuple(
    Benchmark(label, _case(n, n, n, "bfloat16", activation=act), bytes_moved=_bytes, flops=_flops)
    for label, n, act in (
        ("4096³ bf16", 4096, None),
        ("4096³ bf16 + gelu", 4096, "gelu"),
        ("8192³ bf16", 8192, None),
    )
)

BASELINES = {
    "torch": lambda inputs: _torch_matmul(inputs["a"], inputs["b"], inputs["activation"]),
    "torch.compile": lambda inputs: _compiled_matmul()(inputs["a"], inputs["b"], inputs["activation"]),
}

EXERCISE = Exercise(
    name="matmul",
    module="matmul",
    title="Tiled matmul with a fused GeLU epilogue",
    order=4,
    parts=(
        Part(
            name="forward",
            functions=("matmul",),
            make_inputs=make_inputs,
            call=call,
            reference=reference,
            cases=cases,
            examples=EXAMPLES,
            tolerances=TOLERANCES,
            points=10,
            skip=skip,
            bad_inputs=BAD_INPUTS,
            integrity_cases=(_case(40, 50, 70, "float16", "transposed", activation="gelu"),),
            benchmarks=BENCHMARKS,
            baselines=BASELINES,
            speed_baseline="torch",
            reference_launches=1,
            speed_points=5,
        ),
    ),
)
