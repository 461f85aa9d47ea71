"""A FlashAttention case's inputs and its float64 reference outputs: what the batch's reference store records
(a record's identity holds this module's source: :mod:`grader.grading.exercise_run.references`).

q, k, v (and the output gradient do) are drawn in the case's layouts; the references compute softmax(scale·QKᵀ +
mask)·V, its log-sum-exp and the gradients in float64, a chunk of the (batch, head) rows at a time
(:data:`CHUNK_BYTES`), so that a benchmark-size recheck fits in memory.
"""

from __future__ import annotations

import torch

from grader.checks import tensors
from grader.checks.spec import Case

LARGE = 8.0  # "large" q, k: scores scale·q·k have std 64, so exp(score) overflows without the running max


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


def softmax_scale(case_or_inputs) -> float:
    """The case's scale, else the default 1/√D."""
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
    term = softmax_scale(inputs) * case["d"] ** 0.5 * rms["v"] * max(rms["q"], rms["k"])
    do = tensors.over(tensors.values((*tuple(case["lead"]), case["nq"], case["d"]), "normal", g), term)
    return {**inputs, "do": tensors.layout_view(do.to(case.dtype), _layout(case, "do"))}


def make_backward_inputs(case: Case) -> dict:
    """q, k, v, do plus the exact forward outputs, rounded as a correct forward would return them."""
    inputs = make_autograd_inputs(case)
    q, v = inputs["q"], inputs["v"]
    if q.is_meta:  # no values (tensors.generated_on): the outputs' shapes, dtypes and strides, as computed below
        o, lse = q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1])
    else:
        o, lse = attention64(q, inputs["k"], v, inputs["causal"], softmax_scale(inputs))
    return {**inputs, "o": o.to(case.dtype), "lse": lse.to(torch.float32)}


def _grads64(inputs: dict) -> tuple[torch.Tensor, ...]:
    """o, dq, dk, dv of o.backward(do) in float64, a chunk of the (batch, head) rows at a time (the rows are
    independent, so each chunk's graph is freed before the next is built)."""
    q3, k3, v3, do3 = (_rows(inputs[n]) for n in ("q", "k", "v", "do"))
    outs = []
    for c in _chunks(q3, k3):
        q, k, v = (t[c].detach().requires_grad_(True) for t in (q3, k3, v3))
        o, _ = _attention(q, k, v, inputs["causal"], softmax_scale(inputs))
        o.backward(do3[c])
        outs.append((o.detach(), q.grad, k.grad, v.grad))
    shapes = [inputs["do"].shape, inputs["q"].shape, inputs["k"].shape, inputs["v"].shape]
    return tuple(torch.cat([out[i] for out in outs]).reshape(shape) for i, shape in enumerate(shapes))


def forward_reference(inputs: dict) -> dict:
    o, lse = attention64(inputs["q"], inputs["k"], inputs["v"], inputs["causal"], softmax_scale(inputs))
    return {"o": o, "lse": lse}


def backward_reference(inputs: dict) -> dict:
    _, dq, dk, dv = _grads64(inputs)
    return {"dq": dq, "dk": dk, "dv": dv}


def autograd_reference(inputs: dict) -> dict:
    o, dq, dk, dv = _grads64(inputs)
    return {"o": o, "dq": dq, "dk": dk, "dv": dv}
