"""Softmax over the last dimension: any leading dims, rows of 1 to 65,536+ elements, ``-inf``
(masked) entries, inputs up to 1e4 in magnitude. Semantics of ``torch.softmax(x, -1)``, including a
row of only ``-inf`` giving NaN.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import torch

from grader.checks import strategies, tensors
from grader.checks.spec import Benchmark, Case, Exercise, Part, Tolerances

if TYPE_CHECKING:
    from hypothesis import strategies as st

MASKS = ("none", "some", "prefix", "all_first_row")


def make_inputs(case: Case) -> dict:
    g = tensors.generator(case.seed)
    shape = case["shape"]
    data = tensors.values(shape, case["values"], g)
    mask = case.get("mask", "none")
    if mask == "some":  # ~25% of positions masked, as in a padding or dropout mask
        data[torch.rand(shape, generator=g, dtype=torch.float64, device=g.device) < 0.25] = float("-inf")
    elif mask == "prefix":  # a causal-style mask: the first half of each row masked
        data[..., : shape[-1] // 2] = float("-inf")
    elif mask == "all_first_row" and len(shape) > 0:  # torch gives NaN for a fully masked row
        data.view(-1, shape[-1])[0] = float("-inf")
    return {"x": tensors.layout_view(data.to(case.dtype), case["layout"])}


def call(module, inputs: dict) -> dict:
    return {"y": module.softmax(inputs["x"])}


def reference(inputs: dict) -> dict:
    return {"y": torch.softmax(inputs["x"].to(torch.float64), dim=-1)}


def cases(device: str) -> st.SearchStrategy[Case]:
    from hypothesis import strategies as st

    max_numel = 1 << 21 if device == "cuda" else 1 << 16
    return strategies.cases(
        shape=strategies.shapes(min_dims=1, max_dims=3, max_numel=max_numel, max_last=70_000),
        dtype=strategies.dtypes(),
        layout=strategies.layouts(),
        values=st.sampled_from(("normal", "large", "mixed")),
        mask=st.sampled_from(MASKS),
    )


def _case(shape, dtype="float32", layout="contiguous", values="normal", mask="none", seed=0) -> Case:
    return Case({"shape": shape, "dtype": dtype, "layout": layout, "values": values, "mask": mask}, seed)


EXAMPLES = (
    _case((1, 1)),  # a row of one element is exactly 1
    _case((5, 1000)),  # not a power of two: masked loads must use -inf padding
    _case((3, 1000), values="large"),  # scale 1e4: exp overflows without subtracting the max
    _case((4, 257), "float16", "transposed"),
    _case((2, 3, 129), "bfloat16", "strided", mask="some"),
    _case((3, 100), mask="all_first_row"),  # fully masked row: NaN, like torch
    _case((2, 8193), mask="prefix"),  # longer than one block of 8192
    _case((2, 65536)),  # the longest required row
    _case((1, 70001), "float16", values="mixed"),  # longer still, and odd
)

# Computed in fp32 and rounded once: fp16/bf16 use torch.testing's defaults. fp32 softmax values
# are small (1/N), so atol is 1e-6; the sum of up to 65k terms costs ~log2(N)·6e-8 relative.
TOLERANCES = Tolerances(
    (torch.float32, 1e-6, 1e-5),
    (torch.float16, 1e-5, 1e-3),
    (torch.bfloat16, 1e-5, 1.6e-2),
)

# --- speed (GPU) -------------------------------------------------------------------------------
# 128 MB in and 128 MB out, over twice the L2 of an H100/H200: short rows (4096 fp32, one block in
# registers) and long rows (16384 fp16, past the one-block limit: the online kernel).


def _bytes_moved(inputs: dict) -> float:
    x = inputs["x"]
    return 2 * x.numel() * x.element_size()  # a fused kernel reads each row once and writes it once


def _flops(inputs: dict) -> float:
    return 5 * inputs["x"].numel()  # max, subtract, exp, sum, scale


def _softmax_formula(x: torch.Tensor) -> torch.Tensor:
    z = x - x.amax(dim=-1, keepdim=True)
    num = torch.exp(z)
    return num / num.sum(dim=-1, keepdim=True)


@cache
def _compiled_formula():
    return torch.compile(_softmax_formula, dynamic=False)  # compiled lazily: CPU runs never pay for it


BASELINES = {
    "torch": lambda inputs: torch.softmax(inputs["x"], dim=-1),
    "torch.compile": lambda inputs: _compiled_formula()(inputs["x"]),
    "copy": lambda inputs: inputs["x"].clone(),  # the same bytes with no math: the bandwidth roof
}

BENCHMARKS = (
    Benchmark("fp32-8192x4096", _case((8192, 4096)), bytes_moved=_bytes_moved, flops=_flops),
    Benchmark("fp16-4096x16384", _case((4096, 16384), "float16"), bytes_moved=_bytes_moved, flops=_flops),
)

EXERCISE = Exercise(
    name="softmax",
    module="softmax",
    title="Fused softmax",
    order=2,
    parts=(
        Part(
            name="forward",
            functions=("softmax",),
            make_inputs=make_inputs,
            call=call,
            reference=reference,
            cases=cases,
            examples=EXAMPLES,
            tolerances=TOLERANCES,
            points=10,
            integrity_cases=(_case((4, 257), "float16", "transposed"), _case((2, 8193))),
            benchmarks=BENCHMARKS,
            baselines=BASELINES,
            unfused=lambda inputs: _softmax_formula(inputs["x"]),
            speed_baseline="torch",
            reference_launches=1,
            speed_points=5,
        ),
    ),
)
