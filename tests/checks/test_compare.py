"""How a mismatch is explained: counts in plain English, "never written" only for memory no kernel wrote (on a
CPU and a GPU alike: a NaN the kernel computed is a NaN), and hints where the shape of the errors suggests a
cause — each row off by a factor of its own (the row's reduction: padding where the row needs it), small errors
everywhere (formula, constant, precision; a mask ruled out only where no size needs one), errors from a block
boundary on (mask, grid), failures only on non-contiguous inputs (strides), the last in pytest and in the grader's
reports. A single failing check carries the hint its own errors support."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grader import exercises
from grader.checks import compare, execute, loader, tensors, verdicts
from grader.checks.runtime import configure
from grader.checks.spec import Tolerance
from grader.grading import config
from grader.grading.results import scoring
from grader.grading.results.results import CheckResult, ExerciseResult, PartResult, SpeedResult

from .. import known_wrong

GELU = exercises.get("gelu")
TOL = Tolerance(torch.float32, 1e-5, 1e-5)


def _message(got: torch.Tensor, expected: torch.Tensor) -> str:
    mismatch = compare.compare("y", got, expected, TOL)
    assert mismatch is not None
    return mismatch.message


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def test_a_small_systematic_error_suggests_the_formula():
    x = torch.randn(1021, generator=tensors.generator(0), dtype=torch.float64)
    exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))  # the erf GeLU against the tanh one
    message = _message(exact.float(), _gelu_tanh(x))
    assert "elements differ" in message and "hint: the errors are small" in message
    assert "wrong formula or constant" in message and "precision" in message


def test_large_or_isolated_errors_get_no_formula_hint():
    e = torch.randn(1000, generator=tensors.generator(1), dtype=torch.float64)
    assert "hint" not in _message((e * 2).float(), e)  # large errors
    one = e.clone().float()
    one[3] += 1e-3
    assert "hint" not in _message(one, e)  # one element: no pattern


def test_errors_from_a_block_boundary_on_suggest_the_mask_or_grid():
    e = torch.randn(3000, generator=tensors.generator(2), dtype=torch.float64)
    got = e.float()
    got[1024:] = 0.0
    message = _message(got, e)
    assert "the first 1024 elements (in row-major order) are right" in message
    assert "a multiple of 1024" in message and "triton.cdiv" in message
    rows = torch.randn(3, 5000, generator=tensors.generator(3), dtype=torch.float64)
    got = rows.float()
    got[:, 4096:] = 7.0
    message = _message(got, rows)
    assert "in every row the first 4096 columns are right and every column from 4096 on" in message
    shifted = e.float()
    shifted[1000:] = 0.0  # not a power-of-two boundary
    assert "block boundary" not in _message(shifted, e)


def test_counts_are_in_plain_english():
    e = torch.randn(4097, generator=tensors.generator(4), dtype=torch.float64)
    got = e.float()
    tensors.fill_unwritten(got[4096:])
    message = _message(got, e)
    assert "1 of 4097 elements differs" in message
    assert "1 element was never written" in message and "1 elements" not in message
    assert compare.plural(1, "infinity", "infinities") == "1 infinity"
    assert compare.plural(3, "infinity", "infinities") == "3 infinities"


def test_a_computed_nan_is_not_called_never_written():
    e = torch.randn(64, generator=tensors.generator(5), dtype=torch.float64)
    neg_inf = torch.full((64,), float("-inf"))
    computed = torch.exp(neg_inf - neg_inf)  # NaN from arithmetic, as a softmax over a masked block makes it
    assert bool(computed.isnan().all())
    message = _message(computed, e)
    assert "64 NaN where a number was expected" in message and "never written" not in message
    canonical = torch.full((64,), float("nan"))  # torch.empty's deterministic fill has these bits
    assert "never written" not in _message(canonical, e)
    fresh = torch.empty(64)
    tensors.fill_unwritten(fresh)
    assert "64 elements were never written" in _message(fresh, e)


def _gelu_module(tmp_path: Path, body: str, grid: str) -> object:
    """A student module for the gelu exercise with the given kernel body (x, offs, mask in scope)."""
    tree = tmp_path / "impl"
    (tree / "gelu").mkdir(parents=True)
    (tree / "gelu" / "gelu.py").write_text(f'''
import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
{body}
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def gelu(x):
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    _kernel[{grid}](x, y, n, BLOCK=256)
    return y
''')
    return loader.load(tree, GELU, ("gelu",))


def test_real_kernels_computed_nan_versus_skipped_blocks(tmp_path):
    """Through the student's call and the integrity monitor (its fresh memory is marked), in the interpreter on a
    CPU or compiled on a GPU."""
    device = configure().device
    part = GELU.part("forward")
    case = next(c for c in part.examples if c["shape"] == (1021,))
    nan_kernel = _gelu_module(tmp_path / "nan", "    neg = x * 0.0 - float('inf')\n    y = tl.exp(neg - neg)",
                              "(triton.cdiv(n, 256),)")
    verdict = verdicts.run_case(part, nan_kernel, case, device)
    assert not verdict.passed and "1021 NaN where a number was expected" in verdict.message
    assert "never written" not in verdict.message
    tanh_gelu = "    y = x / (1.0 + tl.exp(-1.5957691216057308 * (x + 0.044715 * x * x * x)))"
    half_grid = _gelu_module(tmp_path / "half", tanh_gelu, "(2,)")
    verdict = verdicts.run_case(part, half_grid, case, device)
    assert not verdict.passed and "509 elements were never written" in verdict.message
    assert "every element from 512 on (a multiple of 512) is wrong" in verdict.message


def test_the_monitor_marks_only_what_the_call_allocates_uninitialized():
    part = GELU.part("forward")
    inputs = part.make_inputs(part.examples[2])
    empty = execute.execute(part, SimpleNamespace(gelu=lambda x: torch.empty_like(x)), inputs, "cpu")
    assert bool(tensors.unwritten_mask(empty.outputs["y"]).all())
    zeros = execute.execute(part, SimpleNamespace(gelu=lambda x: torch.zeros_like(x)), inputs, "cpu")
    assert not bool(tensors.unwritten_mask(zeros.outputs["y"]).any())


def test_layout_hint_needs_failures_only_where_an_input_is_non_contiguous():
    assert "non-contiguous input" in compare.layout_hint([(True, True), (True, True), (False, False), (False, False)])
    assert "the failing case has" in compare.layout_hint([(True, True), (True, True), (False, False)])
    assert compare.layout_hint([(True, True), (False, False)]) is None  # one contiguous pass may be a coincidence
    assert compare.layout_hint([(True, False), (False, False)]) is None  # a contiguous case fails too
    assert compare.layout_hint([(False, False)]) is None  # nothing contiguous passed
    assert compare.layout_hint([(True, True), (False, True)]) is None  # nothing failed


def test_pytest_and_the_grader_see_the_strides_hint():
    fixture = next(f for f in known_wrong.discover() if f.id == "gelu/ignores_strides")
    module = loader.load(fixture.root, GELU, ("gelu",))
    part = GELU.part("forward")
    hint = verdicts.examples_layout_hint(part, module, configure().device)
    assert hint and "strides" in hint
    solution = loader.load(known_wrong.SOLUTIONS, GELU, ("gelu",))
    assert verdicts.examples_layout_hint(part, solution, configure().device) is None

    result = PartResult("forward", "graded", speed=SpeedResult("not measured", "no GPU"))
    result.checks = [CheckResult("a", "example", "a", "passed", contiguous=True),
                     CheckResult("a2", "example", "a2", "passed", contiguous=True),
                     CheckResult("b", "random", "b", "failed", "wrong", contiguous=False),
                     CheckResult("c", "integrity", "c", "passed")]
    score = scoring.score_exercise(GELU, ExerciseResult("gelu", "GeLU", "graded", parts=[result]),
                                   config.load_course(), (GELU,))
    assert "hint, from all 3 checks: the failing case has a non-contiguous input" in score.lines[0].output
    assert PartResult.from_dict(result.to_dict()).layout_hint() == result.layout_hint()


@pytest.mark.parametrize("fixture_id", ["gelu/floor_grid", "softmax/one_block"])
def test_known_wrong_unwritten_elements_are_named_and_computed_nans_are_not(fixture_id):
    fixture = next(f for f in known_wrong.discover() if f.id == fixture_id)
    exercise = exercises.get(fixture.exercise)
    part = exercise.parts[0]
    module = loader.load(fixture.root, exercise, part.functions)
    device = configure().device
    messages = [verdicts.run_case(part, module, c, device).message for c in part.examples
                if part.skip(c, device) is None]
    assert any("never written" in m for m in messages)
    if fixture_id == "softmax/one_block":
        # a fully masked 4096-column block computes exp(-inf - -inf) = NaN: not "never written"
        message = next(m for m in messages if "8194 elements were never written" in m)
        assert "16386 NaN where a number was expected" in message


def test_scattered_errors_that_start_on_a_multiple_of_16_get_no_boundary_hint():
    """Two wrong elements of a 7x33 bf16-like case, the first at index 48: a coincidence, not a block boundary."""
    e = torch.randn(7, 33, generator=tensors.generator(4), dtype=torch.float64)
    got = e.float()
    got.view(-1)[48] += 0.5
    got.view(-1)[150] += 0.5
    assert "block boundary" not in _message(got, e)
    rows = torch.randn(4, 64, generator=tensors.generator(5), dtype=torch.float64)
    got = rows.float()
    got[1, 32] += 0.5  # one element of column 32: the column hint needs the block wrong in every row
    assert "block boundary" not in _message(got, rows)
    got = rows.float()
    got[:, 32:48] += 0.5  # one wrong block with right columns after it: a wrong block, not a mask or the grid
    assert "block boundary" not in _message(got, rows)


def _mismatch_by_full_analysis(monkeypatch, got, expected, tol):
    with monkeypatch.context() as patched:
        patched.setattr(compare, "_all_close", lambda *_: False)  # the element-by-element analysis decides alone
        return compare.compare("y", got, expected, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_the_first_pass_passes_exactly_what_the_full_analysis_passes(monkeypatch, dtype):
    """The sliced first pass says "close" only where the full analysis finds no mismatch, and for every output
    whose elements are all finite it says the same: errors around the tolerance's edge (half of it, just under,
    on, just past, twice), NaN and infinities (matched or not), transposed outputs, slices across rows."""
    monkeypatch.setattr(compare, "CLOSE_CHUNK", 7)  # many slices, and boundaries everywhere
    tol = Tolerance(dtype, 2**-7, 2**-6)  # powers of two: an error exactly on the edge is representable
    gen = tensors.generator(5)
    verdicts_seen, disagreements = set(), []
    for trial in range(150):
        expected = torch.randn(9, 13, generator=gen, dtype=torch.float64)
        edge = tol.atol + tol.rtol * expected.abs()
        factor = torch.tensor([0.5, 0.999, 1.0, 1.001, 2.0], dtype=torch.float64)[trial % 5]
        sign = torch.randint(0, 2, expected.shape, generator=gen).to(torch.float64) * 2 - 1
        got = (expected + sign * factor * edge).to(dtype)  # rounded to dtype: either side of the edge
        row, col = trial % 9, (trial * 5) % 13
        kind = trial % 7
        if kind == 2:
            got[row, col], expected[row, col] = float("nan"), float("nan")  # matched NaN: no mismatch, not finite
        elif kind == 3:
            got[row, col] = float("nan")
        elif kind == 4:
            got[row, col], expected[row, col] = float("inf"), float("inf")
        elif kind == 5:
            got[row, col], expected[row, col] = float("inf"), float("-inf")
        elif kind == 6:
            expected[row, col] = float("-inf")
        if trial % 3 == 0:  # exactly on the edge, in every dtype: |got - expected| == atol + rtol·|expected|
            expected[-1, -1], got[-1, -1] = -1.0, -(1 + 2**-6 + 2**-7)
        if trial % 2:
            got, expected = got.t(), expected.t()  # non-contiguous: row-major order must pair the same elements
        full = _mismatch_by_full_analysis(monkeypatch, got, expected, tol)
        finite = bool(torch.isfinite(got.to(torch.float64)).all()) and bool(torch.isfinite(expected).all())
        first = compare._all_close(got, expected, tol)
        verdicts_seen.add(full is None)
        if (first and full is not None) or (finite and first != (full is None)):
            disagreements.append((trial, first, full))
        before = got.clone()
        assert (compare.compare("y", got, expected, tol) is None) == (full is None)
        assert tensors.same_bits(got, before)  # the student's output is never written to
    assert not disagreements
    assert verdicts_seen == {True, False}


def test_the_first_pass_finds_a_mismatch_in_the_last_slice(monkeypatch):
    monkeypatch.setattr(compare, "CLOSE_CHUNK", 64)
    expected = torch.zeros(1000, dtype=torch.float64)
    got = expected.float()
    got[-1] = 1.0
    assert not compare._all_close(got, expected, TOL)
    assert "1 of 1000 elements differs" in _message(got, expected)


def _softmax_padded_with_zeros(x: torch.Tensor, block: int) -> torch.Tensor:
    """Softmax of each row as a kernel computes it when its masked lanes load 0.0 instead of -inf: the padding
    adds exp(0 - max) to every row's sum."""
    padded = torch.cat([x, torch.zeros(*x.shape[:-1], block - x.shape[-1], dtype=x.dtype)], dim=-1)
    num = torch.exp(padded - padded.amax(dim=-1, keepdim=True))
    return (num / num.sum(dim=-1, keepdim=True))[..., :x.shape[-1]]


SOFTMAX_TOL = Tolerance(torch.float32, 1e-6, 1e-5)  # the softmax exercise's float32 tolerance


def test_a_row_scaled_by_its_padding_gets_the_mask_hint_and_never_the_formula_one():
    """Softmax whose masked lanes load 0.0: each row is off by a factor of its own (1.5% here, 15% on the 3-element
    row hypothesis shrinks to). The hint names the padding, never a formula, and rules no mask out. One factor
    shared by every row, or a constant a formula writes, is no padding."""
    x = torch.randn(5, 1000, generator=tensors.generator(6), dtype=torch.float64)
    got, expected = _softmax_padded_with_zeros(x, 1024).float(), torch.softmax(x, -1)
    for evidence in ({}, {"sizes": (5, 1000)}):  # without the case's sizes, and with them
        message = compare.compare("y", got, expected, SOFTMAX_TOL, **evidence).message
        hint = message.split("hint: ", 1)[1]
        assert compare.hint_kind(hint) == "boundary" and "pads it with masked lanes" in hint and "other=" in hint
        assert "slightly wrong formula" not in message and "not of a wrong index or mask" not in message
    short = torch.randn(3, generator=tensors.generator(7), dtype=torch.float64)
    message = compare.compare("y", _softmax_padded_with_zeros(short, 4).float(), torch.softmax(short, -1),
                              SOFTMAX_TOL).message
    assert "all 3 elements are the expected ones times one factor" in message
    assert compare.hint_kind(message.split("hint: ", 1)[1]) == "boundary"

    e = torch.rand(4, 1000, generator=tensors.generator(8), dtype=torch.float64) + 0.5
    assert "masked lanes" not in _message((e * 1.4426950408889634).float(), e)  # log2 for ln, in every row
    assert "hint" not in _message((e[0] * 0.5).float(), e[0])  # a missing 0.5, on a single row


def test_rows_that_need_no_padding_refute_the_padding_explanation():
    """RMSNorm with eps outside the square root scales each row by a factor of its own, on rows of every length:
    rows of 256 (no padding) failing like rows of 768 show that the padding is not the cause."""
    def rms_eps_outside(rows: int, n: int, seed: int) -> str:
        x = 1e-3 * torch.randn(rows, n, generator=tensors.generator(seed), dtype=torch.float64)
        ms = x.pow(2).mean(-1, keepdim=True)
        return _message((x / (ms.sqrt() + 1e-6)).float(), x / (ms + 1e-6).sqrt()).split("hint: ", 1)[1]

    padded, unpadded = rms_eps_outside(8, 768, 9), rms_eps_outside(8, 256, 10)
    assert compare.hint_kind(padded) == "boundary" and "look at the normalizer's formula instead" in padded
    assert compare.hint_kind(unpadded) == "formula" and "a block of its length masks nothing" in unpadded
    checks = [CheckResult(f"forward.random[{i}]", "random", "c", "failed", f"y: wrong\n  hint: {h}", size=i)
              for i, h in enumerate([padded, padded, unpadded])]
    common = PartResult("forward", "graded", checks=checks).common_hint()
    assert common is not None and compare.hint_kind(common[0]) == "formula" and common[1:] == (1, 3)
    assert compare.supported_hints([[padded], [padded]]) == [[padded], [padded]]  # nothing refutes them


def test_the_formula_hint_rules_out_a_mask_only_where_no_size_needs_one():
    def erf_hint(shape: tuple[int, ...], **sizes) -> str:
        x = torch.randn(shape, generator=tensors.generator(11), dtype=torch.float64)
        exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
        mismatch = compare.compare("y", exact.float(), _gelu_tanh(x), TOL, **sizes)
        return mismatch.message.split("hint: ", 1)[1]

    hint = erf_hint((1021,))  # no sizes: no evidence about masks either way
    assert compare.hint_kind(hint) == "formula" and "not of a wrong index or mask" not in hint
    for hint in (erf_hint((1021,), sizes=(1021,)), erf_hint((4, 256), sizes=(4, 256))):
        assert compare.hint_kind(hint) == "formula" and "not of a wrong index or mask" not in hint
    assert "a size of 1021 leaves masked lanes" in erf_hint((1021,), sizes=(1021,))
    ruled_out = erf_hint((64, 256), sizes=(64, 256))
    assert "not of a wrong index or mask: every size of this case is a power of two of at least 16" in ruled_out


def test_a_single_failing_check_carries_the_hint_its_own_errors_support():
    """What ``pytest -x`` shows first: the first failing example, one check on its own."""
    x = torch.tensor([1.3], dtype=torch.float64)
    one = _message((0.5 * x * (1 + torch.erf(x / math.sqrt(2)))).float(), _gelu_tanh(x))  # erf GeLU, one element
    assert "1 of 1 element differs" in one and "hint: the errors are small" in one
    assert compare.hint_kind(one.split("hint: ", 1)[1]) == "formula"
    device = configure().device
    for fixture_id, kind in (("gelu/erf", "formula"), ("softmax/other_zero", "boundary")):
        fixture = next(f for f in known_wrong.discover() if f.id == fixture_id)
        exercise = exercises.get(fixture.exercise)
        part = exercise.parts[0]
        module = loader.load(known_wrong.tree_or_fail(fixture), exercise, part.functions)
        first = next(v for c in part.examples if part.skip(c, device) is None
                     if not (v := verdicts.run_case(part, module, c, device)).passed)
        hints = CheckResult("forward.examples[0]", "example", "first", "failed", first.message).hints()
        assert [compare.hint_kind(h) for h in hints] == [kind], first.message


def test_a_row_factor_on_rows_of_a_power_of_two_blames_no_formula_where_another_size_is_padded():
    """Attention's output rows are the head dimension (16: a power of two), but its reduction runs over the keys: a
    padded key tile that enters the softmax scales every row by a factor of its own. With one key (a size a
    power-of-two block pads), the formula hint would send the student after the wrong bug; no hint is told."""
    gen = tensors.generator(12)
    q, k, v = (torch.randn(4, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    k, v = k[:1], v[:1]  # one key
    right = torch.softmax(q @ k.T / 4, dim=-1) @ v
    keys = torch.cat([k, torch.zeros(15, 16, dtype=torch.float64)])  # 15 padded keys scored 0, not -inf
    values = torch.cat([v, torch.zeros(15, 16, dtype=torch.float64)])
    padded = torch.softmax(q @ keys.T / 4, dim=-1) @ values
    sizes = [4, 16, 1, 16, 1, 16]  # q, k and v's dimensions
    message = compare.compare("o", padded.float(), right, TOL, sizes=sizes).message
    assert "normalizer's formula" not in message and "masks nothing" not in message
    unpadded = compare.compare("o", padded.float(), right, TOL, sizes=[16, 16, 16, 16, 16, 16]).message
    assert compare.hint_kind(unpadded.split("hint: ", 1)[1]) == "formula"  # the same errors with no size padded
