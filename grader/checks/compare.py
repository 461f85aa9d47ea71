"""Compare an output with its float64 reference and explain a mismatch the way a student needs it.

The report gives the mismatch count, max abs/rel error, the first bad indices with got/expected,
NaN/inf mismatches separately from ordinary ones, elements that still hold the never-written pattern
(:data:`grader.checks.tensors.UNWRITTEN_BITS`: no kernel wrote them), and a hint where the shape of the
errors suggests a cause: every element of a row off by one factor (the row's reduction: masked padding
lanes leaking into it where the row needs padding), small errors everywhere (a formula, a constant or too
little precision), errors only from a block boundary on (a mask or the grid). A hint rules a cause out only
where the case itself is evidence against it. :func:`layout_hint` does the same across the cases of a part:
failures only where an input is non-contiguous (strides); :func:`supported_hints` drops a check's hint that
the part's other failing checks refute.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import torch

from grader.checks import tensors
from grader.checks.spec import Inputs, Tolerance
from grader.checks.text import plural

MAX_LISTED = 5
# Mismatches count as small and systematic when every one is finite, the largest is at most this fraction
# of the largest expected magnitude, and at least SPREAD_FRACTION of the elements are off.
SMALL_ERROR = 0.02
SPREAD_FRACTION = 0.05
# Errors that start at an index divisible by this (or a larger power of two) start at a block boundary.
MIN_BLOCK = 16
# Elements per slice of the first pass (:func:`_all_close`): its float64 temporaries (512 KB each) stay in the
# core's cache, which made that pass 7 times faster than whole-tensor operations on a FlashAttention output.
CLOSE_CHUNK = 1 << 16


@dataclass(frozen=True)
class Mismatch:
    output: str
    message: str



def unwritten_mask(got: torch.Tensor) -> torch.Tensor | None:
    """Elements that no kernel wrote (they hold the never-written pattern), or None if the dtype has none."""
    return tensors.unwritten_mask(got)


def compare(name: str, got: torch.Tensor, expected: torch.Tensor, tol: Tolerance, *,
            sizes: Collection[int] = ()) -> Mismatch | None:
    """None if ``got`` matches ``expected`` (float64) within ``tol``, else an explanation. ``sizes``: every dimension
    of the case's tensor inputs, the evidence a hint needs to say that no lane was masked."""
    got = got.detach().cpu()
    if tuple(got.shape) != tuple(expected.shape):
        return Mismatch(name, f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    if got.dtype != tol.dtype:
        return Mismatch(name, f"{name}: dtype {got.dtype}, expected {tol.dtype}")
    if _all_close(got, expected, tol):
        return None
    unwritten = unwritten_mask(got)
    g = got.to(torch.float64)
    e = expected.to(torch.float64)
    g_nan, e_nan = torch.isnan(g), torch.isnan(e)
    g_inf, e_inf = torch.isinf(g), torch.isinf(e)
    finite = ~(g_nan | e_nan | g_inf | e_inf)
    diff = (g - e).abs()
    close = diff <= tol.atol + tol.rtol * e.abs()
    bad_finite = finite & ~close
    nan_mismatch = g_nan != e_nan
    inf_mismatch = (g_inf | e_inf) & ~g_nan & ~e_nan & (g != e)
    bad = bad_finite | nan_mismatch | inf_mismatch
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None

    total = g.numel()
    differ = "differs" if n_bad == 1 else "differ"
    lines = [f"{name}: {n_bad} of {plural(total, 'element')} {differ} "
             f"(atol={tol.atol:g}, rtol={tol.rtol:g}, {tol.dtype})"]
    max_abs = 0.0
    if bool(bad_finite.any()):
        d = torch.where(bad_finite, diff, torch.zeros_like(diff))
        rel = d / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
        max_abs = float(d.max())
        lines.append(f"  max abs error {max_abs:.3g}, max rel error {float(rel.max()):.3g} "
                     f"over {plural(int(bad_finite.sum()), 'finite mismatch', 'finite mismatches')}")
    never = unwritten & ~e_nan if unwritten is not None else None
    if never is not None and bool(never.any()):
        n = int(never.sum())
        lines.append(f"  {plural(n, 'element')} {'was' if n == 1 else 'were'} never written (still holding the "
                     "pattern new tensors are filled with during tests): check the grid covers every element "
                     "and the store mask")
    n_nan_got = int((g_nan & ~e_nan).sum())
    n_nan_exp = int((e_nan & ~g_nan).sum())
    if n_nan_got:
        lines.append(f"  {n_nan_got} NaN where a number was expected")
    if n_nan_exp:
        lines.append(f"  {plural(n_nan_exp, 'number')} where NaN was expected")
    if bool(inf_mismatch.any()):
        n = int(inf_mismatch.sum())
        lines.append(f"  {plural(n, 'infinity', 'infinities')} that {'does' if n == 1 else 'do'} not match "
                     "(sign or presence)")
    lines.append("  first mismatches (index: got vs expected):")
    for index in bad.nonzero()[:MAX_LISTED].tolist():
        idx = tuple(index)
        lines.append(f"    {idx}: {float(g[idx]):.6g} vs {float(e[idx]):.6g}")
    hint = (_row_factor_hint(g, e, bad, bad_finite, finite, tol, sizes)
            or _small_error_hint(bad, bad_finite, max_abs, e, finite, sizes)
            or _boundary_hint(bad))
    if hint:
        lines.append(f"  hint: {hint}")
    return Mismatch(name, "\n".join(lines))


def _all_close(got: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> bool:
    """Every element finite and within ``tol``, computed as :func:`compare` computes it, a slice at a time. True
    only where :func:`compare` finds no mismatch (a NaN or an infinity anywhere gives False: the full analysis
    then decides, and explains). The grader judges every case of every run: most outputs pass, and this pass
    costs them a fraction of the analysis a mismatch needs."""
    g, e = got.reshape(-1), expected.reshape(-1)
    for start in range(0, g.numel(), CLOSE_CHUNK):
        e_part = e[start:start + CLOSE_CHUNK].to(torch.float64)
        diff = g[start:start + CLOSE_CHUNK].to(torch.float64, copy=True).sub_(e_part).abs_()  # never got's own
        bound = e_part.abs().mul_(tol.rtol).add_(tol.atol)
        # an infinite expected value makes its bound infinite, and any difference "close": the analysis decides
        if not bool(diff.le_(bound).all()) or bool(bound.isinf().any()):
            return False
    return True


# Phrases of the row-factor hints: the reports tell their kinds apart by them (HINT_KINDS), and a factor on rows that
# need no padding refutes the padding explanation of the same factor elsewhere (supported_hints).
PADDED_ROWS = "pads it with masked lanes"
UNPADDED_ROWS = "so a block of its length masks nothing"


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _formula_constant(factor: float) -> bool:
    """A factor a formula writes — a power of two times 1, ln 2, √2 or π, or their inverses (a missing 0.5, log2
    for ln) — to within 0.07%: a sum over data lands on one only by chance."""
    return any(abs(r - round(r)) < 1e-3 for k in (1.0, math.log(2), math.sqrt(2), math.pi)
               for r in (math.log2(factor * k), math.log2(factor / k)))


def _row_factor_hint(g: torch.Tensor, e: torch.Tensor, bad: torch.Tensor, bad_finite: torch.Tensor,
                     finite: torch.Tensor, tol: Tolerance, sizes: Collection[int] = ()) -> str | None:
    """Every wrong row (last dimension) is ``expected`` times one factor of its own: something the whole row shares —
    its max, its sum, its mean — is off. That is what masked lanes that leak into the row's reduction give (softmax
    padding loaded as 0 instead of -inf adds exp(0 - max) to every row's sum), and only on rows that need padding; a
    normalizer's formula (where eps goes) gives it on every row. One factor shared by several rows is a constant of the
    formula instead: no hint here. Unlike the small-error hint this one needs no size limit: a padding leak can be
    large. A row whose length is a power of two rules padding out only where no size of the case is padded: the
    reduction may run along another dimension (attention's keys), whose padding scales the rows the same way."""
    length = g.shape[-1] if g.dim() else 1
    if length < 2:
        return None
    wrong_rows = bad_finite.reshape(-1, length).any(dim=1)
    if not bool(wrong_rows.any()) or bool((bad & ~bad_finite).reshape(-1, length)[wrong_rows].any()):
        return None  # a NaN or infinity that does not match is no factor
    fin = finite.reshape(-1, length)[wrong_rows]
    got = torch.where(fin, g.reshape(-1, length)[wrong_rows], 0.0)
    exp = torch.where(fin, e.reshape(-1, length)[wrong_rows], 0.0)
    bound = tol.atol + tol.rtol * exp.abs()
    informative = (exp.abs() > bound).sum(dim=1) >= 2  # a factor measured on one value alone shows nothing
    if not bool(informative.any()):
        return None
    factors = (got * exp).sum(dim=1) / (exp * exp).sum(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
    if not bool((factors > 0).all()) or not bool(((got - factors[:, None] * exp).abs() <= bound).all()):
        return None
    got, exp, bound, factors = got[informative], exp[informative], bound[informative], factors[informative]
    one_row = bad.numel() == length
    if not one_row:
        if len(factors) < 2:
            return None  # one wrong row of many: no pattern
        common = float((got * exp).sum() / (exp * exp).sum())
        if bool(((got - common * exp).abs() <= bound).all()):
            return None  # the same factor in every row: a constant, which the factor alone does not name
        seen = (f"each wrong row is the expected row times a factor of its own ({float(factors[0]):.3g} in the first, "
                f"{float(factors[1]):.3g} in the next): what a row shares — its max, sum or mean, or the normalizer "
                "made of them — is off")
    elif _formula_constant(float(factors[0])):
        return None  # a constant of the formula, not something the row's data sums to: not this hint
    else:
        seen = (f"all {length} elements are the expected ones times one factor ({float(factors[0]):.3g}): what they "
                "share — the row's max, sum or mean, the normalizer made of them, or a constant of the formula — is "
                "off")
    if _is_power_of_two(length) and any(not (_is_power_of_two(n) and n >= MIN_BLOCK) for n in sizes):
        return None  # a padded size elsewhere may be the cause, or the formula: nothing to tell them apart
    if _is_power_of_two(length):
        return (f"{seen}. A row of {length} is a power of two, {UNPADDED_ROWS}: look at the normalizer's formula "
                "(where eps goes, the count a mean divides by) — or, with a block longer than the row, at what the "
                "masked loads fill in (other=)")
    return (f"{seen}. A row of {length} is not a power of two, so a power-of-two block {PADDED_ROWS}: what the "
            "masked loads fill in (other=) must leave the reduction unchanged (-inf for a max or a sum of "
            "exponentials, 0 for a plain sum), and a mean divides by the row length, not the block. If rows whose "
            "length is a power of two fail the same way, look at the normalizer's formula instead (where eps goes)")


def _small_error_hint(bad: torch.Tensor, bad_finite: torch.Tensor, max_abs: float, e: torch.Tensor,
                      finite: torch.Tensor, sizes: Collection[int]) -> str | None:
    """Every mismatch finite and small next to the values, and many of them (or the only element): the math is
    slightly off. A mask is ruled out only where no size of the case needs one."""
    n_bad = int(bad.sum())
    whole = n_bad == bad.numel()  # a one-element output: its one error is all the evidence there is
    if (not whole and (n_bad < 2 or n_bad < SPREAD_FRACTION * bad.numel())) or int(bad_finite.sum()) != n_bad:
        return None
    scale = float(e.abs()[finite].max()) if bool(finite.any()) else 0.0
    if scale <= 0 or max_abs > SMALL_ERROR * scale:
        return None
    where = "cover the whole output (one element)" if bad.numel() == 1 else "spread over many elements"
    hint = (f"the errors are small (at most {100 * max_abs / scale:.2g}% of the largest expected value) and {where} "
            "— the signature of a slightly wrong formula or constant (another approximation, a coefficient, where "
            "eps goes) or of too little precision (accumulate in float32)")
    # A wrong index reads values from elsewhere, which are not close; a mask changes values only where a block pads a
    # size — and then every output of a sum over that size can be slightly off, as here. So a mask is ruled out only
    # where no size is padded by a power-of-two block of at least MIN_BLOCK (none longer than the size).
    padded = next((n for n in sizes if not (_is_power_of_two(n) and n >= MIN_BLOCK)), None)
    if padded is not None:
        hint += (f" — or, as a size of {padded} leaves masked lanes in a power-of-two block ({MIN_BLOCK} or more), "
                 "of a masked load letting wrong values into a sum")
    elif sizes:
        hint += (f", not of a wrong index or mask: every size of this case is a power of two of at least {MIN_BLOCK}, "
                 "which a power-of-two block no longer than it divides")
    return hint


def _boundary_hint(bad: torch.Tensor) -> str | None:
    """Everything before a block boundary is right and everything from it to the end is wrong (in every row, or in
    row-major order): what a mask, the grid, a loop bound or state carried from one block to the next gives — not a
    few scattered elements that happen to start on a multiple of 16, nor a wrong value everywhere."""
    if bad.dim() >= 2:
        rows = bad.reshape(-1, bad.shape[-1])
        columns = rows.any(dim=0).nonzero()
        first = int(columns[0]) if len(columns) else 0
        if first >= MIN_BLOCK and first % MIN_BLOCK == 0 and bool(rows[:, first:].all()):
            return (f"in every row the first {first} columns are right and every column from {first} on (a multiple "
                    f"of {first & -first}) is wrong: a block boundary — check the mask, and that the loop or grid "
                    f"covers the columns past the first block")
    flat = bad.reshape(-1)
    found = flat.nonzero()
    first = int(found[0]) if len(found) else 0
    if first >= MIN_BLOCK and first % MIN_BLOCK == 0 and bool(flat[first:].all()):
        return (f"the first {first} elements (in row-major order) are right and every element from {first} on (a "
                f"multiple of {first & -first}) is wrong: a block boundary — check the mask, that the grid covers "
                "every block (triton.cdiv), and what is carried from one block to the next")
    return None


HINT_KINDS = {  # a phrase each kind of hint says, and its kind (reports group the hints of a part's checks by kind)
    "slightly wrong formula": "formula",
    UNPADDED_ROWS: "formula",
    "a block boundary": "boundary",
    PADDED_ROWS: "boundary",
    "non-contiguous input": "layout",
}
HINT_SUPPORT = 1 / 3  # a part's hint is told only when at least this share of its failing checks give it


def hint_kind(hint: str) -> str | None:
    return next((kind for phrase, kind in HINT_KINDS.items() if phrase in hint), None)


def supported_hints(hints: list[list[str]]) -> list[list[str]]:
    """The hints of a part's failing checks (one list per check) less those the other checks refute: a row factor put
    down to masked padding lanes is not the padding where rows that need no padding show a row factor too."""
    if not any(UNPADDED_ROWS in h for check in hints for h in check):
        return hints
    return [[h for h in check if PADDED_ROWS not in h] for check in hints]


def inputs_contiguous(inputs: Inputs) -> bool:
    """Whether every tensor input is contiguous (a storage offset alone does not count)."""
    return all(v.is_contiguous() for v in inputs.values() if isinstance(v, torch.Tensor))


def layout_hint(outcomes: Iterable[tuple[bool, bool]]) -> str | None:
    """A hint from a part's cases, each ``(inputs contiguous, passed)``: every failure has a non-contiguous
    input while the contiguous cases pass."""
    outcomes = list(outcomes)
    failed = [contiguous for contiguous, passed in outcomes if not passed]
    # two contiguous cases that pass at least: one may pass for another reason (a default argument, say)
    if not failed or any(failed) or sum(contiguous and passed for contiguous, passed in outcomes) < 2:
        return None
    which = "the failing case has" if len(failed) == 1 else f"all {len(failed)} failing cases have"
    return (f"{which} a non-contiguous input (transposed or strided) and every case with contiguous inputs "
            "passes: the kernel probably assumes a dense row-major layout — "
            "address elements through the input's strides (x.stride(d)), or make a contiguous copy first")


def describe_tensor(t: torch.Tensor) -> str:
    layout = "contiguous" if t.is_contiguous() else "non-contiguous"
    off = f", storage offset {t.storage_offset()}" if t.storage_offset() else ""
    return f"shape {tuple(t.shape)}, {str(t.dtype).removeprefix('torch.')}, strides {t.stride()} ({layout}{off})"
