"""FlashAttention-2, forward and backward: ``o = softmax(scale · q kᵀ [+ causal mask]) v`` for q
(..., Nq, D) and k, v (..., Nk, D), the row log-sum-exp ``lse`` (natural log, fp32), and the gradients
dq, dk, dv. Any leading dims, Nq ≠ Nk, N = 1 and N just past a tile, D in {16, 32, 64, 128}, scores
large enough that exp overflows without the running max, fp32/fp16/bf16.

Three parts, two reports: ``forward`` (o and lse), ``backward`` (dq, dk, dv from
``flash_attention_backward`` given float64-exact o and lse) and ``autograd`` (o, dq, dk, dv end to end
through ``flash_attention(...).backward(do)``), the last two reported together as "backward".

This module holds the spec: the calls, cases, tolerances, benchmarks and points. Beside it, a case's inputs and
its float64 references (:mod:`.flash_attention_reference`), the bad inputs (:mod:`.flash_attention_bad_inputs`),
the forward's extra check ``memory``, which makes sure it never materializes the Nq×Nk score matrix
(:mod:`.flash_attention_memory`), and the speed baselines (:mod:`.flash_attention_baselines`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from grader.checks import strategies
from grader.checks.spec import Benchmark, Case, Exercise, Part, Tolerance, Tolerances
from grader.exercises.flash_attention_bad_inputs import BACKWARD_BAD_INPUTS, FORWARD_BAD_INPUTS
from grader.exercises.flash_attention_baselines import AUTOGRAD_BASELINES, FORWARD_BASELINES
from grader.exercises.flash_attention_memory import MEMORY_CHECK
from grader.exercises.flash_attention_reference import (
    LAYOUTS,
    autograd_reference,
    backward_reference,
    forward_reference,
    make_autograd_inputs,
    make_backward_inputs,
    make_forward_inputs,
)

if TYPE_CHECKING:
    from hypothesis import strategies as st

HEAD_DIMS = (16, 32, 64, 128)
TF32_MAX_N = 512  # longest fp32 sequence checked on the GPU (see _skip)
GPU_MAX_N = 2100  # longest random sequence on the GPU: the tolerances below are calibrated up to here
MAX_RATIO = 16  # on the GPU, long sequences keep Nq/Nk within this factor (see _skip)


# ----------------------------------------------------------------------------------------------
# Calls of the student's functions
# ----------------------------------------------------------------------------------------------


def _unpack(result, n: int, function: str, names: str) -> tuple:
    if not isinstance(result, tuple | list) or len(result) != n:
        raise TypeError(f"{function} must return a tuple ({names}), got {type(result).__name__}")
    return tuple(result)


def call_forward(module, inputs: dict) -> dict:
    result = module.flash_attention_forward(inputs["q"], inputs["k"], inputs["v"], is_causal=inputs["causal"],
                                            scale=inputs["scale"])
    o, lse = _unpack(result, 2, "flash_attention_forward", "o, lse")
    return {"o": o, "lse": lse}


def call_backward(module, inputs: dict) -> dict:
    result = module.flash_attention_backward(inputs["q"], inputs["k"], inputs["v"], inputs["o"], inputs["lse"],
                                             inputs["do"], is_causal=inputs["causal"], scale=inputs["scale"])
    dq, dk, dv = _unpack(result, 3, "flash_attention_backward", "dq, dk, dv")
    return {"dq": dq, "dk": dk, "dv": dv}


def call_autograd(module, inputs: dict) -> dict:
    q, k, v = (inputs[n].detach().requires_grad_(True) for n in ("q", "k", "v"))
    o = module.flash_attention(q, k, v, is_causal=inputs["causal"], scale=inputs["scale"])
    if not isinstance(o, torch.Tensor) or o.grad_fn is None:
        raise TypeError("flash_attention must return a tensor that autograd can differentiate "
                        "(apply a torch.autograd.Function)")
    o.backward(inputs["do"])
    return {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------


def _case(lead, nq, nk, d, dtype="float32", causal=False, values="normal", scale=None, layout="contiguous",
          seed=0) -> Case:
    return Case({"lead": tuple(lead), "nq": nq, "nk": nk, "d": d, "dtype": dtype, "causal": causal,
                 "values": values, "scale": scale, "layout": layout}, seed)


@strategies.composite
def _lead(draw, max_heads: int) -> tuple[int, ...]:
    from hypothesis import strategies as st

    ndim = draw(st.integers(0, 3))
    dims: list[int] = []
    for _ in range(ndim):
        dims.append(draw(st.integers(1, max(1, max_heads // max(1, math.prod(dims))))))
    return tuple(dims)


def cases(device: str) -> st.SearchStrategy[Case]:
    """Sequences up to ~150 in the interpreter (it runs ~10⁴ tile iterations a second), up to 2k on the
    GPU; bf16 only on the GPU (the interpreter's bf16 tl.dot is wrong)."""
    from hypothesis import strategies as st

    cuda = device == "cuda"
    max_n = GPU_MAX_N if cuda else 150
    dims = HEAD_DIMS if cuda else HEAD_DIMS[:3]
    dtype_names = strategies.DTYPE_NAMES if cuda else ("float32", "float16")

    @st.composite
    def build(draw):
        dtype = draw(st.sampled_from(dtype_names))
        tf32 = cuda and dtype == "float32"  # see _skip: TF32 limits fp32 cases on the GPU
        causal = draw(st.booleans())
        nq = draw(strategies.sizes(TF32_MAX_N if tf32 else max_n))
        nk = nq if causal else draw(strategies.sizes(TF32_MAX_N if tf32 else max_n))
        if cuda and _lopsided(nq, nk):  # see _skip
            nq, nk = (nq, -(-nq // MAX_RATIO)) if nq > nk else (-(-nk // MAX_RATIO), nk)
        d = draw(st.sampled_from(dims))
        values = "normal" if tf32 else draw(st.sampled_from(("normal", "large")))
        # A custom scale: half or twice the default, so gradients keep the default's magnitude range
        # (the tolerances are absolute); large scores only with the default scale, for the same reason.
        factor = None if values == "large" else draw(st.sampled_from((None, 0.5, 2.0)))
        scale = None if factor is None else round(factor * d**-0.5, 6)
        return _case(draw(_lead(4)), nq, nk, d, dtype, causal, values, scale,
                     draw(st.sampled_from(LAYOUTS)), draw(strategies.seeds()))

    return build()


def _lopsided(nq: int, nk: int) -> bool:
    return max(nq, nk) > 256 and max(nq, nk) > MAX_RATIO * min(nq, nk)


def _skip(case: Case, device: str) -> str | None:
    if device == "cuda" and _lopsided(case["nq"], case["nk"]):
        return (f"Nq/Nk beyond {MAX_RATIO}x at N > 256: each of a few keys (or queries) sums thousands of "
                "rounded dS terms, so 16-bit gradient errors exceed any tolerance that still finds bugs")
    if device != "cuda":
        if case["dtype"] == "bfloat16":
            return "bf16 tl.dot is wrong in the Triton interpreter; runs on the GPU only"
        if max(case["nq"], case["nk"]) > 512:
            return "long sequence: too slow for the Triton interpreter; runs on the GPU only"
    elif case["dtype"] == "float32" and case["values"] == "large":
        return ("fp32 tl.dot is TF32 on the GPU (10-bit mantissa): scores of magnitude ~200 move by ~0.05, "
                "beyond any useful tolerance; large scores are checked in fp16/bf16 here and in fp32 on the CPU")
    elif case["dtype"] == "float32" and max(case["nq"], case["nk"]) > TF32_MAX_N:
        return (f"fp32 tl.dot is TF32 on the GPU, whose error grows with the sequence length: fp32 is checked up "
                f"to N = {TF32_MAX_N} here (and at any length in fp16/bf16)")
    return None


FORWARD_EXAMPLES = (
    _case((1,), 1, 1, 16),  # one query, one key: o = v, lse = the single score
    _case((2, 3), 37, 53, 32, layout="mixed"),  # Nq ≠ Nk, neither a tile multiple, two leading dims; q, k, v strides
    _case((2,), 65, 65, 64, "float16", causal=True),  # one past a tile multiple, causal
    _case((), 33, 33, 16, causal=True),  # no leading dims
    _case((2,), 17, 150, 32, values="large"),  # exp overflows without the running max; many key tiles
    _case((1, 2), 48, 97, 64, "float16", layout="transposed"),  # column-major q, k, v
    _case((3,), 1, 129, 16, scale=0.3),  # one query row; a custom scale
    _case((2, 1, 2), 40, 40, 32, "float16", causal=True, values="large", layout="strided"),
    _case((2, 2), 70, 70, 32, "bfloat16", causal=True),
    _case((1,), 1025, 1025, 128, "bfloat16", causal=True),  # GPU: long, D = 128
    _case((2,), 640, 1000, 128, "float16", layout="offset"),  # GPU: long, Nq ≠ Nk
)
BACKWARD_EXAMPLES = (
    _case((1,), 1, 1, 16),
    _case((2, 3), 37, 53, 32, layout="mixed"),
    _case((2,), 65, 65, 64, "float16", causal=True),
    _case((), 33, 33, 16, causal=True, layout="strided"),
    _case((2,), 17, 150, 32, values="large"),
    _case((1, 2), 100, 31, 16, "float16", values="large", layout="transposed"),
    _case((3,), 129, 1, 32, scale=0.3),  # one key: P = 1, dS = 0, so dq = dk = 0 exactly
    _case((2, 2), 70, 70, 64, "bfloat16", causal=True),
    _case((1,), 1025, 1025, 128, "bfloat16", causal=True),
)
AUTOGRAD_EXAMPLES = (
    _case((2,), 47, 47, 32, causal=True, layout="mixed"),
    _case((1, 2), 33, 70, 16, "float16", scale=0.3, layout="transposed"),  # the custom scale reaches the backward
    _case((2,), 65, 65, 64, "bfloat16", causal=True, values="large"),
    _case((1, 3), 2049, 2049, 64, "bfloat16", causal=True),
)


# ----------------------------------------------------------------------------------------------
# Tolerances
# ----------------------------------------------------------------------------------------------
# Calibrated on the solution in the interpreter (fp32, fp16; CPU cases) and on a PyTorch emulation of
# an FA2 kernel's roundings on the GPU cases (fp16 — it reproduces the interpreter's errors exactly —
# bf16, and TF32 for fp32), examples plus several hundred random cases per part and dtype. Every
# band is 2.5-3× the largest error seen. Gradients are compared at the scale make_autograd_inputs
# sets (one term scale·dS·k of a sum is O(1)).
# * fp32 in the interpreter is IEEE fp32, but exp() turns the rounding of a score s into a relative
#   error ~|s|·2^-24: with "large" scores (|s| up to ~300) that is ~2e-5.
# * fp16/bf16: an FA2 kernel rounds P to the input dtype before P·V and Pᵀ·dO, and dS before dS·K
#   and dSᵀ·Q; o (which Δ = rowsum(dO ∘ O) uses) and the outputs are rounded too. The sums carry a
#   few units of roundoff of their terms: up to 3e-3 (fp16) and 3.4e-2 (bf16, a long causal sequence
#   of large scores). bf16's unit roundoff is 8× fp16's (2^-8 vs 2^-11).
# * GPU fp32: tl.dot is TF32: the tensor cores read q, k, v, P, dO, dS with 10-bit mantissas
#   (truncated, so the error is biased) while Δ is exact fp32, so dS ≈ 2^-10·|dP| where it should
#   cancel, summed over every query: up to 3e-2 on the gradients, 7e-3 on lse, 2e-3 on o, for
#   N ≤ TF32_MAX_N. Bugs of FlashAttention are O(1) and still show; fp32 is held tight on the CPU.
# * lse is fp32 in every dtype and sums exact products of the (16-bit) inputs, so it is held to fp32
#   accuracy (TF32 scores of fp32 inputs on the GPU excepted).
# Bugs are far outside: lse in base 2 is off by 44%, an off-by-one mask or a missing rescale changes
# o by O(1), a missing scale on dK multiplies it by √D (tests/fixtures/flash_attention prove each).
O_TOL = Tolerances(
    (torch.float32, 5e-5, 5e-5),
    (torch.float16, 1e-3, 2e-3),
    (torch.bfloat16, 8e-3, 1.6e-2),
    cuda=[(torch.float32, 5e-3, 5e-3)],
)


class _Float32Output(Tolerances):
    """Tolerances chosen by the input dtype for an output that is float32 whatever the input (lse)."""

    def get(self, dtype: torch.dtype, device: str) -> Tolerance:
        tol = super().get(dtype, device)
        return Tolerance(torch.float32, tol.atol, tol.rtol)


LSE_TOL = _Float32Output(
    (torch.float32, 5e-5, 2e-5),
    (torch.float16, 5e-5, 2e-5),
    (torch.bfloat16, 5e-5, 2e-5),
    cuda=[(torch.float32, 3e-2, 1e-4), (torch.float16, 1e-4, 2e-5), (torch.bfloat16, 1e-4, 2e-5)],
)
GRAD_TOL = Tolerances(
    (torch.float32, 5e-5, 1e-4),
    (torch.float16, 8e-3, 5e-3),
    (torch.bfloat16, 8e-2, 2e-2),
    cuda=[(torch.float32, 8e-2, 2e-2)],
)
FORWARD_TOLERANCES = {"o": O_TOL, "lse": LSE_TOL}
GRAD_TOLERANCES = {"o": O_TOL, "dq": GRAD_TOL, "dk": GRAD_TOL, "dv": GRAD_TOL}


# ----------------------------------------------------------------------------------------------
# Speed (GPU): H100-sized benchmarks (the baselines: flash_attention_baselines.py)
# ----------------------------------------------------------------------------------------------


def _flops(inputs: dict, factor: float = 1.0) -> float:
    q, k = inputs["q"], inputs["k"]
    heads = math.prod(q.shape[:-2])
    flops = 4.0 * heads * q.shape[-2] * k.shape[-2] * q.shape[-1]
    return flops * (0.5 if inputs["causal"] else 1.0) * factor


def _bench(label, lead, n, d, causal) -> Benchmark:
    return Benchmark(label, _case(lead, n, n, d, "bfloat16", causal), flops=lambda inp: _flops(inp))


def _bench_fb(label, lead, n, d, causal) -> Benchmark:  # forward + backward: 1 + 2.5 forwards
    return Benchmark(label, _case(lead, n, n, d, "bfloat16", causal), flops=lambda inp: _flops(inp, 3.5))


_BENCH_SIZES = (  # bf16; the cheapest first: the speed recheck computes its float64 reference (maybe on the CPU)
    # batch 8: at smaller batches the Python launch path is a large share of the call, and the ratios
    # vary too much to credit (docs/decisions/0011-benchmark-shapes.md)
    ("b8h16-n2048-d64-causal", (8, 16), 2048, 64, True),
    ("b2h16-n4096-d128", (2, 16), 4096, 128, False),
    ("b2h16-n4096-d128-causal", (2, 16), 4096, 128, True),
    ("cs336-h16-n16384-d64-causal", (1, 16), 16384, 64, True),  # the CS336 leaderboard shape
)


# ----------------------------------------------------------------------------------------------
# The exercise
# ----------------------------------------------------------------------------------------------

EXERCISE = Exercise(
    name="flash_attention",
    module="flash_attention",
    title="FlashAttention-2 (forward and backward)",
    order=5,
    parts=(
        Part(
            name="forward",
            functions=("flash_attention_forward",),
            make_inputs=make_forward_inputs,
            call=call_forward,
            reference=forward_reference,
            cases=cases,
            examples=FORWARD_EXAMPLES,
            tolerances=FORWARD_TOLERANCES,
            points=15,
            skip=_skip,
            bad_inputs=FORWARD_BAD_INPUTS,
            report_as="forward",
            integrity_cases=(FORWARD_EXAMPLES[2],),
            extra_checks=(MEMORY_CHECK,),
            benchmarks=tuple(_bench(*s) for s in _BENCH_SIZES),
            baselines=FORWARD_BASELINES,
            speed_baseline="sdpa-flash",
            reference_launches=1,
            speed_points=5,
        ),
        Part(
            name="backward",
            functions=("flash_attention_backward",),
            make_inputs=make_backward_inputs,
            call=call_backward,
            reference=backward_reference,
            cases=cases,
            examples=BACKWARD_EXAMPLES,
            tolerances=GRAD_TOLERANCES,
            points=15,
            skip=_skip,
            bad_inputs=BACKWARD_BAD_INPUTS,
            report_as="backward",
            integrity_cases=(BACKWARD_EXAMPLES[2],),
        ),
        Part(
            name="autograd",
            functions=("flash_attention",),
            make_inputs=make_autograd_inputs,
            call=call_autograd,
            reference=autograd_reference,
            cases=cases,
            examples=AUTOGRAD_EXAMPLES,
            tolerances=GRAD_TOLERANCES,
            points=5,
            skip=_skip,
            report_as="backward",
            integrity_cases=(AUTOGRAD_EXAMPLES[0],),
            benchmarks=tuple(_bench_fb(*s) for s in _BENCH_SIZES),
            baselines=AUTOGRAD_BASELINES,
            speed_baseline="sdpa-flash",
            reference_launches=4,
            speed_points=5,
        ),
    ),
)
