"""Compare an output with its float64 reference and explain a mismatch the way a student needs it.

The report gives the mismatch count, max abs/rel error, the first bad indices with got/expected,
NaN/inf mismatches separately from ordinary ones, and elements that still hold the NaN pattern that
``torch.empty`` is filled with during tests (so: never written by the kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grader.checks.spec import Tolerance

MAX_LISTED = 5

# torch.utils.deterministic.fill_uninitialized_memory fills float tensors with the canonical quiet
# NaN. Arithmetic NaNs differ in their bits on both targets (x86 produces the negative "indefinite"
# NaN, NVIDIA GPUs 0x7FFFFFFF), so this pattern marks memory that nothing wrote.
_FILL_NAN_BITS = {
    torch.float32: (torch.int32, 0x7FC00000),
    torch.float16: (torch.int16, 0x7E00),
    torch.bfloat16: (torch.int16, 0x7FC0),
}


@dataclass(frozen=True)
class Mismatch:
    output: str
    message: str


def unwritten_mask(got: torch.Tensor) -> torch.Tensor | None:
    """Elements holding torch.empty's NaN fill pattern, or None if the dtype has none."""
    if got.dtype not in _FILL_NAN_BITS:
        return None
    int_dtype, bits = _FILL_NAN_BITS[got.dtype]
    raw = got.view(int_dtype)  # same element size: a valid view for any strides
    if int_dtype == torch.int16 and bits > 0x7FFF:
        bits -= 0x10000
    return raw == bits


def compare(name: str, got: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> Mismatch | None:
    """None if ``got`` matches ``expected`` (float64) within ``tol``, else an explanation."""
    got = got.detach().cpu()
    if tuple(got.shape) != tuple(expected.shape):
        return Mismatch(name, f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    if got.dtype != tol.dtype:
        return Mismatch(name, f"{name}: dtype {got.dtype}, expected {tol.dtype}")
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
    lines = [f"{name}: {n_bad} of {total} elements differ (atol={tol.atol:g}, rtol={tol.rtol:g}, {tol.dtype})"]
    if bool(bad_finite.any()):
        d = torch.where(bad_finite, diff, torch.zeros_like(diff))
        rel = d / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
        lines.append(
            f"  max abs error {float(d.max()):.3g}, max rel error {float(rel.max()):.3g} "
            f"over {int(bad_finite.sum())} finite mismatches"
        )
    if unwritten is not None and bool((unwritten & ~e_nan).any()):
        n = int((unwritten & ~e_nan).sum())
        lines.append(
            f"  {n} elements were never written (they still hold torch.empty's NaN fill): "
            "check the grid covers every element and the store mask"
        )
    n_nan_got = int((g_nan & ~e_nan).sum())
    n_nan_exp = int((e_nan & ~g_nan).sum())
    if n_nan_got:
        lines.append(f"  {n_nan_got} NaN where a number was expected")
    if n_nan_exp:
        lines.append(f"  {n_nan_exp} numbers where NaN was expected")
    if bool(inf_mismatch.any()):
        lines.append(f"  {int(inf_mismatch.sum())} infinities that do not match (sign or presence)")
    lines.append("  first mismatches (index: got vs expected):")
    for index in bad.nonzero()[:MAX_LISTED].tolist():
        idx = tuple(index)
        lines.append(f"    {idx}: {float(g[idx]):.6g} vs {float(e[idx]):.6g}")
    return Mismatch(name, "\n".join(lines))


def describe_tensor(t: torch.Tensor) -> str:
    layout = "contiguous" if t.is_contiguous() else "non-contiguous"
    off = f", storage offset {t.storage_offset()}" if t.storage_offset() else ""
    return f"shape {tuple(t.shape)}, {str(t.dtype).removeprefix('torch.')}, strides {t.stride()} ({layout}{off})"
