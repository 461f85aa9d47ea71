"""Fuzz the grader's trusted side with the outputs a student's code may return: every supported dtype, sizes
0, 1 and large, steps > 1, zero strides (expanded), storage offsets and non-contiguous views. Nothing may
raise, and every verdict must be the one the same data gets when it is made contiguous.

On a GPU the outputs are made on the device and go the worker's way (copied to the CPU, sent through the
protocol) first; ``pytest -m gpu`` runs that variant."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grader import exercises
from grader.checks import compare, tensors
from grader.checks.call_records import Execution
from grader.checks.spec import Tolerance
from grader.grading.exercise_run.item_plan import Item
from grader.grading.exercise_run.judging import ExerciseJudge, output_fingerprint
from grader.grading.isolation import protocol, wire

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.bool]
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: the worker-side copy of device outputs is tested there")])]
GELU = exercises.get("gelu")


@st.composite
def layouts(draw, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """A tensor of ``dtype`` in an odd layout: its values are random, its strides anything a view can have."""
    ndim = draw(st.integers(0, 3))
    shape = [draw(st.sampled_from([0, 1, 1, 2, 3, 7, 64])) for _ in range(ndim)]
    if ndim and draw(st.booleans()) and draw(st.booleans()):
        shape = [1] * (ndim - 1) + [1 << 17]  # large
    kind = draw(st.sampled_from(["contiguous", "step", "expanded", "offset", "transposed", "step+offset"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    base_shape = list(shape)
    if kind in ("step", "step+offset") and ndim:
        base_shape[-1] = shape[-1] * draw(st.integers(2, 3))
    numel = math.prod(base_shape) + 2
    flat = torch.randn(numel, generator=g, dtype=torch.float64) * 3
    flat = (flat > 0) if dtype == torch.bool else flat.to(dtype)
    flat = flat.to(device)
    offset = 2 if "offset" in kind else 0
    base = flat[offset: offset + math.prod(base_shape)].view(base_shape)
    if kind in ("step", "step+offset") and ndim:
        step = base_shape[-1] // max(shape[-1], 1) if shape[-1] else 2
        return base[..., ::step][..., : shape[-1]]
    if kind == "expanded" and ndim:
        small = base.narrow(ndim - 1, 0, min(1, shape[-1]))
        return small.expand(*shape)
    if kind == "transposed" and ndim >= 2:
        return base.transpose(-1, -2).contiguous().transpose(-1, -2)
    return base


def _worker_side(t: torch.Tensor) -> torch.Tensor:
    """What the grader receives: the worker's CPU copy, through the protocol's wire form."""
    ex = Execution(outputs={"y": t.detach().cpu().clone()}, output_devices={"y": t.device.type})
    import io

    buf = io.BytesIO()
    torch.save(wire.encode(protocol.CaseDone("x", ex)), buf)
    buf.seek(0)
    reply = wire.decode(torch.load(buf, weights_only=True))
    assert isinstance(reply, protocol.CaseDone)
    return reply.execution.outputs["y"]


def _tolerance(dtype: torch.dtype) -> Tolerance:
    return Tolerance(dtype, 1e-3, 1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_compare_and_fingerprints_agree_with_the_contiguous_copy(device, dtype, data):
    got = _worker_side(data.draw(layouts(dtype, device)))
    dense = got.contiguous().clone()
    expected = dense.to(torch.float64) if dtype != torch.bool else dense.double()
    if dense.numel() and data.draw(st.booleans()):
        expected = expected.clone()
        expected[(0,) * expected.dim()] += 1.0  # one element wrong
    a = compare.compare("y", got, expected, _tolerance(dtype))
    b = compare.compare("y", dense, expected, _tolerance(dtype))
    assert (a is None) == (b is None) and (a is None or a.message == b.message)
    assert output_fingerprint({"y": got}) == output_fingerprint({"y": dense})
    assert tensors.same_bits(got, dense)
    assert tensors.raw_bytes(got) == tensors.raw_bytes(dense)
    mask = compare.unwritten_mask(got)
    if mask is not None:
        assert torch.equal(mask, compare.unwritten_mask(dense))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_judging_a_returned_call_never_raises_and_ignores_the_layout(device, data):
    """The grader's judge on gelu replies: the right values in any layout pass, a wrong value fails, the
    same right output for other inputs is a replay; never a grader error."""
    dtype_name = data.draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    part = GELU.parts[0]
    template = data.draw(layouts(torch.float32))
    case = part.examples[0].with_seed(data.draw(st.integers(0, 1000)))
    case = type(case)({**case.params, "shape": tuple(template.shape), "dtype": dtype_name}, case.seed)
    inputs = part.make_inputs(case)
    right = part.reference(inputs)["y"].to(case.dtype)
    # the right values in the template's layout
    holder = torch.empty_strided(template.shape, template.stride(), dtype=case.dtype) if not (
        0 in template.stride() and template.numel() > 1) else torch.empty(template.shape, dtype=case.dtype)
    holder.copy_(right)
    outputs = {"y": _worker_side(holder.to(device))}
    wrong = data.draw(st.booleans()) and right.numel() > 0
    if wrong:
        outputs["y"] = outputs["y"].clone()
        outputs["y"][(0,) * outputs["y"].dim()] = float("nan")

    judge = ExerciseJudge(GELU, device="cpu", student_dir="/nonexistent")
    item = Item(f"forward.examples[{case.label}]", part, "examples", "example", case.label, case, full=False)
    ex = Execution(outputs=outputs, output_devices={"y": "cpu"})
    judge.on_reply(item, protocol.RunCase(item.id, part.name, inputs, False), protocol.CaseDone(item.id, ex))
    state = judge.parts[part.name]
    assert state.errors == []
    assert state.checks[item.id].passed is (not wrong)
    # the same output for fresh inputs: a replay when it was right before and is wrong now
    fresh_case = case.with_seed(case.seed + 1)
    fresh_inputs = part.make_inputs(fresh_case)
    fresh = Item("forward.integrity[fresh]", part, "integrity", "fresh", fresh_case.label, fresh_case)
    judge.on_reply(fresh, protocol.RunCase(fresh.id, part.name, fresh_inputs, False), protocol.CaseDone(fresh.id, ex))
    assert state.errors == []
    differs = not torch.equal(part.reference(fresh_inputs)["y"].to(case.dtype), right)
    judge._replays(part, state)
    assert ("fresh-inputs" in state.flags) is (not wrong and differs and right.numel() > 0)
