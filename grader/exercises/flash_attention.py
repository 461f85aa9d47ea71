"""FlashAttention-2, forward and backward: ``o = softmax(scale · q kᵀ [+ causal mask]) v`` for q
(..., Nq, D) and k, v (..., Nk, D), the row log-sum-exp ``lse`` (natural log, fp32), and the gradients
dq, dk, dv. Any leading dims, Nq ≠ Nk, N = 1 and N just past a tile, D in {16, 32, 64, 128}, scores
large enough that exp overflows without the running max, fp32/fp16/bf16.

Three parts, two reports: ``forward`` (o and lse), ``backward`` (dq, dk, dv from
``flash_attention_backward`` given float64-exact o and lse) and ``autograd`` (o, dq, dk, dv end to end
through ``flash_attention(...).backward(do)``), the last two reported together as "backward".
References are float64 (:func:`attention64`, a chunk of the batch and heads at a time). The forward's extra
check ``memory`` (:data:`MEMORY_CHECK`) makes sure it never materializes the Nq×Nk score matrix.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from grader.checks import integrity, strategies, tensors
from grader.checks.spec import BadInput, Benchmark, Case, Exercise, ExtraCheck, Observation, Part, Tolerance, Tolerances
from grader.checks.verdicts import Verdict

if TYPE_CHECKING:
    from hypothesis import strategies as st

HEAD_DIMS = (16, 32, 64, 128)
TF32_MAX_N = 512  # longest fp32 sequence checked on the GPU (see _skip)
GPU_MAX_N = 2100  # longest random sequence on the GPU: the tolerances below are calibrated up to here
MAX_RATIO = 16  # on the GPU, long sequences keep Nq/Nk within this factor (see _skip)
LARGE = 8.0  # "large" q, k: scores scale·q·k have std 64, so exp(score) overflows without the running max


# ----------------------------------------------------------------------------------------------
# Inputs and references
# ----------------------------------------------------------------------------------------------


# "mixed": every tensor in a layout of its own, so that a kernel reading one tensor with another's strides is wrong
# (the layouts alone give q, k, v and do the same strides)
MIXED = {"q": "contiguous", "k": "strided", "v": "transposed", "do": "offset"}
LAYOUTS = (*tensors.LAYOUTS, "mixed")


def _layout(case: Case, name: str) -> str:
    return MIXED[name] if case["layout"] == "mixed" else case["layout"]


def _qkv(case: Case, g: torch.Generator) -> dict:
    lead, nq, nk, d = tuple(case["lead"]), case["nq"], case["nk"], case["d"]
    mag = LARGE if case["values"] == "large" else 1.0
    shapes = {"q": (*lead, nq, d), "k": (*lead, nk, d), "v": (*lead, nk, d)}
    out = {}
    for name, shape in shapes.items():
        data = tensors.times(tensors.values(shape, "normal", g), mag if name != "v" else 1.0)
        out[name] = tensors.layout_view(data.to(case.dtype), _layout(case, name))
    return out


def _scale(case_or_inputs) -> float:
    scale = case_or_inputs["scale"]
    return case_or_inputs["d"] ** -0.5 if scale is None else scale


CHUNK_BYTES = 256 << 20  # the float64 scores of one chunk of (batch, head) rows: bounds a reference's memory


def _attention(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale·QKᵀ + mask)·V and the natural-log logsumexp, as written (q, k, v already float64)."""
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        nq, nk = s.shape[-2:]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def _chunks(q: torch.Tensor, k: torch.Tensor) -> list[slice]:
    """Slices of the flattened (batch, head) rows whose scores take at most :data:`CHUNK_BYTES` together: a
    benchmark call's whole score matrix (b8, h16, n2048) would take 4 GiB in float64, and autograd keeps several."""
    rows, per_row = q.shape[0], q.shape[-2] * k.shape[-2] * 8
    step = max(1, CHUNK_BYTES // max(1, per_row))
    return [slice(i, min(rows, i + step)) for i in range(0, rows, step)] or [slice(0, 0)]


def _rows(t: torch.Tensor) -> torch.Tensor:
    """float64, the leading (batch, head) dimensions flattened into one."""
    return t.detach().to(torch.float64).reshape(-1, *t.shape[-2:])


def attention64(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 reference: explicit softmax(scale·QKᵀ + mask)·V and the natural-log logsumexp, a chunk of the
    (batch, head) rows at a time."""
    q3, k3, v3 = _rows(q), _rows(k), _rows(v)
    outs = [_attention(q3[c], k3[c], v3[c], causal, scale) for c in _chunks(q3, k3)]
    o, lse = torch.cat([o for o, _ in outs]), torch.cat([lse for _, lse in outs])
    return o.reshape(*q.shape[:-1], v.shape[-1]), lse.reshape(q.shape[:-1])


def _params(case: Case) -> dict:
    return {"causal": bool(case["causal"]), "scale": case["scale"], "d": case["d"]}


def make_forward_inputs(case: Case) -> dict:
    return {**_qkv(case, tensors.generator(case.seed)), **_params(case)}


def make_autograd_inputs(case: Case) -> dict:
    """q, k, v and the output gradient do, scaled by 1 / (scale·√D·|v|·max(|q|, |k|)) (RMS sizes).

    dq and dk are sums of terms scale·dS·k with dS ~ P·(dO·v), and their rounding errors scale with
    those terms, not with the (often much smaller) sums: large scores make P one-hot and the sums
    cancel, a 2× scale doubles every term. The scaling makes one term O(1) in every case (it is 1 for
    normal inputs at the default scale), so one absolute tolerance per dtype fits all cases; the
    gradients are linear in do, so it changes nothing else."""
    g = tensors.generator(case.seed)
    inputs = {**_qkv(case, g), **_params(case)}
    rms = {n: 1.0 if inputs[n].is_meta else float(inputs[n].double().square().mean().sqrt())  # meta: no values
           for n in ("q", "k", "v")}
    term = _scale(inputs) * case["d"] ** 0.5 * rms["v"] * max(rms["q"], rms["k"])
    do = tensors.over(tensors.values((*tuple(case["lead"]), case["nq"], case["d"]), "normal", g), term)
    return {**inputs, "do": tensors.layout_view(do.to(case.dtype), _layout(case, "do"))}


def make_backward_inputs(case: Case) -> dict:
    """q, k, v, do plus the exact forward outputs, rounded as a correct forward would return them."""
    inputs = make_autograd_inputs(case)
    q, v = inputs["q"], inputs["v"]
    if q.is_meta:  # no values (tensors.generated_on): the outputs' shapes, dtypes and strides, as computed below
        o, lse = q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1])
    else:
        o, lse = attention64(q, inputs["k"], v, inputs["causal"], _scale(inputs))
    return {**inputs, "o": o.to(case.dtype), "lse": lse.to(torch.float32)}


def _grads64(inputs: dict) -> tuple[torch.Tensor, ...]:
    """o, dq, dk, dv of o.backward(do) in float64, a chunk of the (batch, head) rows at a time (the rows are
    independent, so each chunk's graph is freed before the next is built)."""
    q3, k3, v3, do3 = (_rows(inputs[n]) for n in ("q", "k", "v", "do"))
    outs = []
    for c in _chunks(q3, k3):
        q, k, v = (t[c].detach().requires_grad_(True) for t in (q3, k3, v3))
        o, _ = _attention(q, k, v, inputs["causal"], _scale(inputs))
        o.backward(do3[c])
        outs.append((o.detach(), q.grad, k.grad, v.grad))
    shapes = [inputs["do"].shape, inputs["q"].shape, inputs["k"].shape, inputs["v"].shape]
    return tuple(torch.cat([out[i] for out in outs]).reshape(shape) for i, shape in enumerate(shapes))


def forward_reference(inputs: dict) -> dict:
    o, lse = attention64(inputs["q"], inputs["k"], inputs["v"], inputs["causal"], _scale(inputs))
    return {"o": o, "lse": lse}


def backward_reference(inputs: dict) -> dict:
    _, dq, dk, dv = _grads64(inputs)
    return {"dq": dq, "dk": dk, "dv": dv}


def autograd_reference(inputs: dict) -> dict:
    o, dq, dk, dv = _grads64(inputs)
    return {"o": o, "dq": dq, "dk": dk, "dv": dv}


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
# Bad input
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Memory: the forward must not materialize the Nq×Nk scores
# ----------------------------------------------------------------------------------------------


MEMORY_N = {"cuda": 16384, "cpu": 1024}
MEMORY_POINTS = 3


def _memory_shape(device: str) -> tuple[int, int, torch.dtype]:
    n = MEMORY_N["cuda" if device == "cuda" else "cpu"]
    return (n, 64, torch.bfloat16) if device == "cuda" else (n, 16, torch.float16)


def execute_memory(module, device: str) -> dict:
    """Run the causal forward on one long head (N = 16384 on the GPU, 1024 in the interpreter; D = 64 / 16)
    and record the bytes of all tensors it creates (every device) and its peak memory above the inputs
    (CUDA)."""
    n, d, dtype = _memory_shape(device)
    g = tensors.generator(n)
    q, k, v = (torch.randn((1, 1, n, d), generator=g).to(dtype).to(device) for _ in range(3))
    call = lambda: module.flash_attention_forward(q, k, v, is_causal=True, scale=None)  # causal: half the time
    try:
        peak = 0
        if device == "cuda":
            call()  # compile and autotune outside the measurement
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        with integrity.monitor() as seen:  # the ops it dispatches outside Triton launches, with their allocations
            call()
        if device == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
    except NotImplementedError:
        raise
    except Exception as exc:
        return {"allocated": 0, "peak": 0, "error": f"{type(exc).__name__}: {exc}"}
    return {"allocated": int(seen.allocated_bytes), "peak": int(peak), "error": None}


def judge_memory(observation: Observation, device: str) -> Verdict:
    """Fail at a quarter of a 16-bit N×N score matrix or more."""
    n, d, _ = _memory_shape(device)
    if observation["error"] is not None:
        return Verdict(False, f"flash_attention_forward raised {observation['error']} on q, k, v of shape "
                              f"(1, 1, {n}, {d})")
    budget = n * n * 2 // 4
    allocated, peak = observation["allocated"], observation["peak"]
    worst = max(allocated, peak)
    if worst < budget:
        return Verdict(True)
    what = "allocated" if allocated >= peak else "raised peak GPU memory by"
    return Verdict(False, f"flash_attention_forward {what} {worst / 2**20:.1f} MiB for Nq = Nk = {n}, D = {d}, "
                          f"one head; the limit is {budget / 2**20:.1f} MiB (a quarter of one 16-bit "
                          f"{n}×{n} score matrix). FlashAttention keeps score tiles on chip: never write S or "
                          "P to memory")


MEMORY_CHECK = ExtraCheck(
    name="memory",
    description="a long sequence must not allocate an Nq×Nk score matrix",
    execute=execute_memory,
    judge=judge_memory,
    fields={"allocated": int, "peak": int, "error": (str, type(None))},
    points=MEMORY_POINTS,
)


# ----------------------------------------------------------------------------------------------
# Speed (GPU): H100-sized benchmarks and baselines
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
    # batch 8: the reference's Python launch path costs ~0.1 ms per forward and ~0.45 ms per
    # forward+backward through autograd (measured on an H200), as much as the GPU time at batch 4:
    # ratios then varied by 9% (CV) across 10 runs; at batch 1 by 21%
    ("b8h16-n2048-d64-causal", (8, 16), 2048, 64, True),
    ("b2h16-n4096-d128", (2, 16), 4096, 128, False),
    ("b2h16-n4096-d128-causal", (2, 16), 4096, 128, True),
    ("cs336-h16-n16384-d64-causal", (1, 16), 16384, 64, True),  # the CS336 leaderboard shape
)


def _sdpa(backend: str):
    def run(inputs: dict, backward: bool = False):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
        q, k, v = (inputs[n].detach().requires_grad_(backward) for n in ("q", "k", "v"))
        with sdpa_kernel(which):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=inputs["causal"], scale=inputs["scale"])
        if backward:
            o.backward(inputs["do"])
            return {"o": o, "dq": q.grad, "dk": k.grad, "dv": v.grad}  # named as the part's outputs
        return o

    return run


def _naive(backward: bool = False):
    """Naive PyTorch attention (S and P in HBM, softmax in fp32), a few heads at a time so the score
    matrices stay under 2 GiB: the same work and traffic per head as one big call, without the OOM."""

    def run(inputs: dict):
        q, k, v, do = (inputs[n].detach() for n in ("q", "k", "v", "do" if backward else "q"))
        n_q, n_k = q.shape[-2], k.shape[-2]
        q3, k3, v3, do3 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v, do))
        chunk = max(1, 2**31 // (n_q * n_k * 4))
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1) if inputs["causal"] else None
        outs = []
        for i in range(0, q3.shape[0], chunk):
            qc, kc, vc = (t[i : i + chunk].requires_grad_(backward) for t in (q3, k3, v3))
            s = (qc @ kc.transpose(-1, -2)).float() * _scale(inputs)
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            o = torch.softmax(s, dim=-1).to(q.dtype) @ vc
            if backward:
                o.backward(do3[i : i + chunk])
            outs.append(o.detach())
        return torch.cat(outs).view(q.shape)

    return run


FORWARD_BASELINES = {"sdpa-flash": _sdpa("flash"), "sdpa-cudnn": _sdpa("cudnn"), "torch": _naive()}
AUTOGRAD_BASELINES = {
    "sdpa-flash": lambda inp: _sdpa("flash")(inp, backward=True),
    "sdpa-cudnn": lambda inp: _sdpa("cudnn")(inp, backward=True),
    "torch": _naive(backward=True),
}


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
