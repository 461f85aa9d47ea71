"""GeLU, tanh approximation, elementwise over any shape and any strides.

    gelu(x) = 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))
"""

from __future__ import annotations

import math
from functools import cache
from typing import TYPE_CHECKING

import torch

from grader.checks import strategies, tensors
from grader.checks.spec import Benchmark, Case, Exercise, Part, Tolerances

if TYPE_CHECKING:
    from hypothesis import strategies as st

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def make_inputs(case: Case) -> dict:
    g = tensors.generator(case.seed)
    return {"x": tensors.make(case["shape"], case.dtype, g, kind=case["values"], layout=case["layout"])}


def call(module, inputs: dict) -> dict:
    return {"y": module.gelu(inputs["x"])}


def gelu_reference(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.float64)
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def reference(inputs: dict) -> dict:
    return {"y": gelu_reference(inputs["x"])}


def cases(device: str) -> st.SearchStrategy[Case]:
    from hypothesis import strategies as st

    max_numel = 1 << 20 if device == "cuda" else 1 << 14
    return strategies.cases(
        shape=strategies.shapes(min_dims=1, max_dims=4, max_numel=max_numel),
        dtype=strategies.dtypes(),
        layout=strategies.layouts(),
        values=st.sampled_from(tensors.VALUES),
    )


def _case(shape, dtype="float32", layout="contiguous", values="normal", seed=0) -> Case:
    return Case({"shape": shape, "dtype": dtype, "layout": layout, "values": values}, seed)


EXAMPLES = (
    _case((1,)),
    _case(()),  # a 0-dim tensor is a shape too
    _case((1021,)),  # prime: the last block is partial
    _case((4097,), "float16"),  # one past a power of two
    _case((3, 257), "float16", "transposed"),
    _case((7, 33), "bfloat16", "strided"),
    _case((2, 3, 129), "float32", "offset"),
    _case((4096,), "float32", values="large"),  # |x| up to ~4e4: tanh must not overflow to NaN
    _case((64, 65), "bfloat16", values="mixed"),
)

# The kernel computes in fp32 and rounds once to the output dtype, so fp16/bf16 keep
# torch.testing's defaults (half an ulp is 4.9e-4 / 3.9e-3 relative). fp32 allows 1e-5: 1 + tanh(z)
# cancels for z << 0, costing up to ~|x|·6e-8 absolute.
TOLERANCES = Tolerances(
    (torch.float32, 1e-5, 1e-5),
    (torch.float16, 1e-5, 1e-3),
    (torch.bfloat16, 1e-5, 1.6e-2),
)

# --- speed (GPU) -------------------------------------------------------------------------------
# Two 32M/64M-element tensors: 128 MB read + 128 MB written, over twice the L2 of an H100/H200
# (50/60 MB), so the kernel streams from HBM; ~0.1 ms at ~3 TB/s.


def _bytes_moved(inputs: dict) -> float:
    x = inputs["x"]
    return 2 * x.numel() * x.element_size()  # read x once, write y once


def _flops(inputs: dict) -> float:
    return 9 * inputs["x"].numel()  # x·x·x, ·0.044715, +x, ·√(2/π), tanh, +1, ·x, ·0.5 (tanh counted as one)


def _gelu_formula(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


@cache
def _compiled_formula():
    return torch.compile(_gelu_formula, dynamic=False)  # compiled lazily: CPU runs never pay for it


BASELINES = {
    "torch": lambda inputs: torch.nn.functional.gelu(inputs["x"], approximate="tanh"),  # one fused kernel
    "torch.compile": lambda inputs: _compiled_formula()(inputs["x"]),  # the formula, fused by Inductor
    "copy": lambda inputs: inputs["x"].clone(),  # the same bytes with no math: the bandwidth roof
}

BENCHMARKS = (
    Benchmark("fp32-4096x8192", _case((4096, 8192), "float32"), bytes_moved=_bytes_moved, flops=_flops),
    Benchmark("bf16-8192x8192", _case((8192, 8192), "bfloat16"), bytes_moved=_bytes_moved, flops=_flops),
)

EXERCISE = Exercise(
    name="gelu",
    module="gelu",
    title="Fused GeLU",
    order=1,
    parts=(
        Part(
            name="forward",
            functions=("gelu",),
            make_inputs=make_inputs,
            call=call,
            reference=reference,
            cases=cases,
            examples=EXAMPLES,
            tolerances=TOLERANCES,
            points=10,
            integrity_cases=(_case((3, 257), "float16", "transposed"),),
            benchmarks=BENCHMARKS,
            baselines=BASELINES,
            unfused=lambda inputs: _gelu_formula(inputs["x"]),
            speed_baseline="torch",
            reference_launches=1,
            speed_points=5,
        ),
    ),
)
