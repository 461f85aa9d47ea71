"""RMSNorm over the last dimension, forward and backward:

    y = x / sqrt(mean(x², dim=-1) + eps) · weight

Any leading dims, hidden sizes H from 1 to 16,384, fp32/fp16/bf16, non-contiguous x, weight (H,).
The backward part checks dx and dweight from ``y.backward(dy)`` against float64 autograd.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from grader.checks import strategies, tensors
from grader.checks.spec import BadInput, Benchmark, Case, Exercise, Part, Tolerances

if TYPE_CHECKING:
    from hypothesis import strategies as st

EPS_VALUES = (1e-6, 1e-5, 1e-2)
# dy is drawn at the scale of x, so dx = rstd·(w·dy − x̂·c) is O(1) for every value kind (see
# BACKWARD_TOLERANCES). "large" and "mixed" x would make dx or dweight span many orders of magnitude
# within one case; the forward part covers them.
BACKWARD_VALUES = ("normal", "small")
DY_SCALE = {"normal": 1.0, "small": 1e-3}


def make_inputs(case: Case) -> dict:
    g = tensors.generator(case.seed)
    shape = case["shape"]
    x = tensors.make(shape, case.dtype, g, kind=case["values"], layout=case["layout"])
    weight = tensors.values(shape[-1:], "normal", g).to(case.dtype)
    return {"x": x, "weight": weight, "eps": case["eps"]}


def make_backward_inputs(case: Case) -> dict:
    inputs = make_inputs(case)
    g = tensors.generator(case.seed ^ 0x5EED)
    dy = tensors.times(tensors.values(case["shape"], "normal", g), DY_SCALE[case["values"]])
    return {**inputs, "dy": dy.to(case.dtype)}


def call_forward(module, inputs: dict) -> dict:
    return {"y": module.rmsnorm(inputs["x"], inputs["weight"], inputs["eps"])}


def call_backward(module, inputs: dict) -> dict:
    # detach() keeps x's strides, so the backward sees the same non-contiguous x as the forward.
    x = inputs["x"].detach().requires_grad_()
    weight = inputs["weight"].detach().requires_grad_()
    y = module.rmsnorm(x, weight, inputs["eps"])
    y.backward(inputs["dy"])
    return {"y": y.detach(), "dx": x.grad, "dweight": weight.grad}


def _formula(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def reference_forward(inputs: dict) -> dict:
    return {"y": _formula(inputs["x"].to(torch.float64), inputs["weight"].to(torch.float64), inputs["eps"])}


def reference_backward(inputs: dict) -> dict:
    x = inputs["x"].to(torch.float64).requires_grad_()
    weight = inputs["weight"].to(torch.float64).requires_grad_()
    y = _formula(x, weight, inputs["eps"])
    y.backward(inputs["dy"].to(torch.float64))
    return {"y": y.detach(), "dx": x.grad, "dweight": weight.grad}


@strategies.composite
def _shapes(draw, *, max_rows: int, max_h: int, max_numel: int, min_h: int = 1):
    """(*leading, H): 0 to 2 leading dims whose product (the number of rows) stays under max_rows."""
    from hypothesis import strategies as st

    h = draw(strategies.sizes(max_h, min_h))
    budget = max(1, min(max_rows, max_numel // h))
    lead = []
    for _ in range(draw(st.integers(0, 2))):
        d = draw(strategies.sizes(budget))
        lead.append(d)
        budget = max(1, budget // d)
    return (*lead, h)


def _cases(device: str, values: tuple[str, ...], min_h: int = 1, max_rows: int = 4096) -> st.SearchStrategy[Case]:
    from hypothesis import strategies as st

    # The interpreter spends a few ms per row (forward + backward): keep CPU row counts small; the
    # examples have the many-rows cases.
    if device == "cuda":
        shapes = _shapes(max_rows=max_rows, max_h=16384, max_numel=1 << 22, min_h=min_h)
    else:
        shapes = _shapes(max_rows=64, max_h=16384, max_numel=1 << 15, min_h=min_h)
    return st.builds(
        lambda shape, dtype, layout, kind, eps, seed: Case(
            {"shape": shape, "dtype": dtype, "layout": layout, "values": kind, "eps": eps}, seed
        ),
        shapes,
        strategies.dtypes(),
        strategies.layouts(),
        st.sampled_from(values),
        st.sampled_from(EPS_VALUES),
        strategies.seeds(),
    )


def forward_cases(device: str) -> st.SearchStrategy[Case]:
    return _cases(device, tensors.VALUES)


def backward_cases(device: str) -> st.SearchStrategy[Case]:
    # Rows of 1 to 3 elements make dx ill-conditioned in fp32 (docs/decisions/0011-benchmark-shapes.md):
    # random cases use H >= 4; the (1, 1) example still checks a single element. Rows: see BACKWARD_TOLERANCES.
    return _cases(device, BACKWARD_VALUES, min_h=4, max_rows=1024)


def _case(shape, dtype="float32", layout="contiguous", values="normal", eps=1e-6, seed=0) -> Case:
    return Case({"shape": shape, "dtype": dtype, "layout": layout, "values": values, "eps": eps}, seed)


FORWARD_EXAMPLES = (
    _case((1, 1)),  # H = 1: y = x / sqrt(x² + eps) · w
    _case((16384,)),  # one row of the largest required size
    _case((7, 1000), "float16", "transposed"),  # H not a power of two, column-major x
    _case((3, 5, 129), "bfloat16", "strided"),
    _case((4, 4096), "float16", values="large"),  # |x| ~ 1e4: x² overflows fp16 unless computed in fp32
    _case((8, 768), values="small"),  # mean(x²) ~ 1e-6 ~ eps: eps must be inside the square root
    _case((8, 256), eps=1e-2),  # a large eps: sqrt(ms + eps) vs sqrt(ms) + eps differ by ~0.5%
    _case((2, 3, 100), layout="offset", values="mixed"),
    _case((16, 4097), "bfloat16", values="small", eps=1e-5),
)

BACKWARD_EXAMPLES = (
    _case((1, 1)),
    _case((4097,), "float16"),  # a single 1-D row, one past a power of two
    _case((300, 129)),  # many rows: dweight sums over every block of rows
    _case((4, 16384)),
    _case((2, 40, 77), "float16", "transposed"),
    _case((17, 300), "bfloat16", "strided"),
    _case((64, 256), values="small"),
    _case((16, 512), "float16", eps=1e-2),
    _case((40, 3, 5), layout="offset", values="small", eps=1e-5),
)

# y = x̂·w is a product of O(1) numbers computed in fp32 and rounded once: fp16/bf16 keep
# torch.testing's defaults (half an ulp is 4.9e-4 / 3.9e-3 relative); fp32 allows 1e-5 relative
# for the mean of up to 16k squares and rsqrt (a few ulp).
FORWARD_TOLERANCES = Tolerances(
    (torch.float32, 1e-6, 1e-5),
    (torch.float16, 1e-5, 1e-3),
    (torch.bfloat16, 1e-5, 1.6e-2),
)
# dx = rstd·(w·dy − x̂·c) cancels: its fp32 error is ~1e-7 of the terms, which are O(1) because dy
# comes at x's scale, hence atol 1e-5 with 1e-5 relative. dweight = Σ_rows dy·x̂ sums O(1) terms
# whose partial sums grow like √k: even one plain sequential fp32 loop over all R rows drifts by
# ~2e-8·R (std), 2e-5 at R = 1024 — so backward cases keep R ≤ 1024 (300 on the CPU) and atol is
# 1e-4 (5σ); rtol stays 1e-5 since |dweight| itself grows like √R. fp16/bf16: one rounding of each
# output, torch.testing's rtol.
BACKWARD_TOLERANCES = {
    "y": FORWARD_TOLERANCES,
    "dx": Tolerances(
        (torch.float32, 1e-5, 1e-5),
        (torch.float16, 1e-5, 1e-3),
        (torch.bfloat16, 1e-5, 1.6e-2),
    ),
    "dweight": Tolerances(
        (torch.float32, 1e-4, 1e-5),
        (torch.float16, 1e-4, 1e-3),
        (torch.bfloat16, 1e-4, 1.6e-2),
    ),
}

BAD_INPUTS = (
    BadInput(
        "weight of the wrong shape",
        "rmsnorm",
        lambda d: ((torch.ones(4, 8, device=d), torch.ones(7, device=d)), {}),
        raises=(ValueError,),
        match="weight",
    ),
)

# --- speed (GPU): sizes for an H100/H200 and the PyTorch baselines --------------------------------


def _torch_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The usual PyTorch formula (as in Llama): compute in fp32, cast back."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


@functools.cache
def _compiled_rmsnorm():
    # Static shapes give the fastest kernels; each (shape, dtype, grad mode) is then its own graph,
    # more than dynamo's default limit of 8 recompiles (after which it silently runs eager).
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # torch < 2.7
    setattr(cfg, name, max(getattr(cfg, name), 64))
    return torch.compile(_torch_rmsnorm, dynamic=False)


def _fwd_bwd(fn, inputs: dict):
    x = inputs["x"].detach().requires_grad_()
    weight = inputs["weight"].detach().requires_grad_()
    fn(x, weight, inputs["eps"]).backward(inputs["dy"])
    return {"dx": x.grad, "dweight": weight.grad}  # named as the part's outputs: the timer compares them


def _forward_bytes(inputs: dict) -> float:  # read x, write y, read weight
    x, w = inputs["x"], inputs["weight"]
    return float(2 * x.numel() * x.element_size() + w.numel() * w.element_size())


def _backward_bytes(inputs: dict) -> float:  # forward (2·N) + backward: read x and dy, write dx (3·N)
    x, w = inputs["x"], inputs["weight"]
    return float(5 * x.numel() * x.element_size() + 2 * w.numel() * w.element_size())


def _forward_flops(inputs: dict) -> float:  # x², sum, ·rstd, ·w
    return 4.0 * inputs["x"].numel()


def _backward_flops(inputs: dict) -> float:  # forward + x̂, w·dy, x̂·w·dy, sum, −x̂·c, ·rstd, dy·x̂, sum
    return 12.0 * inputs["x"].numel()


def _benchmarks(bytes_moved, flops) -> tuple[Benchmark, ...]:
    return tuple(
        Benchmark(f"{rows}x{h} {dtype}", _case((rows, h), dtype), bytes_moved=bytes_moved, flops=flops)
        for rows, h in ((16384, 4096), (4096, 16384))
        for dtype in ("bfloat16", "float32")
    )


FORWARD_BASELINES = {
    "torch": lambda inputs: _torch_rmsnorm(inputs["x"], inputs["weight"], inputs["eps"]),
    "torch.compile": lambda inputs: _compiled_rmsnorm()(inputs["x"], inputs["weight"], inputs["eps"]),
    "copy": lambda inputs: inputs["x"].clone(),  # the bandwidth yardstick: reads and writes x once
}
BACKWARD_BASELINES = {
    "torch": lambda inputs: _fwd_bwd(_torch_rmsnorm, inputs),
    "torch.compile": lambda inputs: _fwd_bwd(_compiled_rmsnorm(), inputs),
}

EXERCISE = Exercise(
    name="rmsnorm",
    module="rmsnorm",
    title="RMSNorm forward and backward",
    order=3,
    parts=(
        Part(
            name="forward",
            functions=("rmsnorm",),
            make_inputs=make_inputs,
            call=call_forward,
            reference=reference_forward,
            cases=forward_cases,
            examples=FORWARD_EXAMPLES,
            tolerances=FORWARD_TOLERANCES,
            points=5,
            bad_inputs=BAD_INPUTS,
            report_as="rmsnorm",
            integrity_cases=(_case((7, 1000), "float16", "transposed"),),
            benchmarks=_benchmarks(_forward_bytes, _forward_flops),
            baselines=FORWARD_BASELINES,
            speed_baseline="torch",
            reference_launches=1,
            speed_points=5,
        ),
        Part(
            name="backward",
            functions=("rmsnorm",),
            make_inputs=make_backward_inputs,
            call=call_backward,
            reference=reference_backward,
            cases=backward_cases,
            examples=BACKWARD_EXAMPLES,
            tolerances=BACKWARD_TOLERANCES,
            points=5,
            report_as="rmsnorm",
            # No extra allowed ops: the autograd engine's own bookkeeping is already allowed (measured with
            # the integrity monitor on this transposed x: AccumulateGrad copies dx into x's layout with
            # new_empty_strided + copy_; plus detach).
            integrity_cases=(_case((2, 40, 77), "float16", "transposed"),),
            benchmarks=_benchmarks(_backward_bytes, _backward_flops),
            baselines=BACKWARD_BASELINES,
            speed_baseline="torch",
            reference_launches=3,
            # Not speed-graded: autograd's host-side overhead is comparable to the call's device time, so its
            # ratio is too unstable to credit (docs/decisions/0011-benchmark-shapes.md). `grader bench` reports it.
            speed_points=0,
        ),
    ),
)
