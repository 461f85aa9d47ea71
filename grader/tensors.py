"""Deterministic test tensors: shapes, layouts (non-contiguous views) and value ranges from a seed.

Everything is generated on the CPU from ``torch.Generator(seed)`` so that any process (the pytest
run, the grader's worker and its verdict process) rebuilds bit-identical inputs from a case.
"""

from __future__ import annotations

import math

import torch

LAYOUTS = ("contiguous", "transposed", "strided", "offset")
VALUES = ("normal", "large", "small", "mixed")


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    return g


def values(shape: tuple[int, ...], kind: str, g: torch.Generator) -> torch.Tensor:
    """float64 values of one of the VALUES kinds."""
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if kind == "normal":
        return x
    if kind == "large":  # exercise overflow paths: x**3, exp(x - max)
        return x * 1e4
    if kind == "small":
        return x * 1e-3
    if kind == "mixed":  # heavy-tailed: mostly O(1), some up to 1e4
        scale = torch.exp(torch.rand(shape, generator=g, dtype=torch.float64) * math.log(1e4))
        return x * scale
    raise ValueError(f"unknown value kind {kind!r}")


def layout_view(data: torch.Tensor, layout: str) -> torch.Tensor:
    """A view of a fresh buffer with ``data``'s values and the requested memory layout."""
    shape = tuple(data.shape)
    if layout == "contiguous" or data.dim() == 0:
        return data.clone()
    if layout == "transposed":  # last two dims swapped in memory (column-major matrix)
        if data.dim() < 2:
            return layout_view(data, "strided")
        buf = data.transpose(-1, -2).contiguous()
        return buf.transpose(-1, -2)
    if layout == "strided":  # every other element of the last dim
        buf = torch.zeros((*shape[:-1], 2 * shape[-1]), dtype=data.dtype)
        view = buf[..., ::2]
        view.copy_(data)
        return view
    if layout == "offset":  # starts one element into its storage
        buf = torch.zeros(data.numel() + 1, dtype=data.dtype)
        view = buf[1:].view(shape)
        view.copy_(data)
        return view
    raise ValueError(f"unknown layout {layout!r}")


def make(shape, dtype: torch.dtype, g: torch.Generator, *, kind="normal", layout="contiguous"):
    """Random tensor of ``dtype`` with a given value kind and memory layout (CPU)."""
    data = values(tuple(shape), kind, g).to(dtype)
    return layout_view(data, layout)


def to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    """Copy a tensor to ``device`` keeping its exact strides and storage offset (always a copy)."""
    itemsize = t.element_size()
    n = t.untyped_storage().nbytes() // itemsize
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
    return flat.to(device, copy=True).as_strided(t.shape, t.stride(), t.storage_offset())


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaNs compare equal to themselves)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point():
        ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        a, b = a.contiguous().view(ints), b.contiguous().view(ints)
    return bool(torch.equal(a, b))
