"""Deterministic test tensors: shapes, layouts (non-contiguous views) and value ranges from a seed.

Everything is generated on the CPU from ``torch.Generator(seed)`` so that any process (the pytest
run, the grader's worker and its verdict process) rebuilds bit-identical inputs from a case. Timing inputs
are the exception (:func:`generated_on`): only their sizes and distributions matter, and drawing hundreds of
megabytes on the CPU costs seconds per benchmark. On the ``meta`` device tensors have shapes, dtypes and strides
but no values: enough to count a benchmark's bytes and FLOPs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import torch

_DEVICE: ContextVar[str] = ContextVar("tensors_device", default="cpu")


@contextlib.contextmanager
def generated_on(device: str) -> Iterator[None]:
    """Within the block, :func:`generator`, :func:`values` and :func:`layout_view` work on ``device``: same
    shapes, layouts and distributions as on the CPU, other values for the same seed."""
    token = _DEVICE.set(device)
    try:
        yield
    finally:
        _DEVICE.reset(token)

LAYOUTS = ("contiguous", "transposed", "strided", "offset")
VALUES = ("normal", "large", "small", "mixed")


def generator(seed: int) -> torch.Generator:
    device = _DEVICE.get()
    g = torch.Generator(device="cpu" if device == "meta" else device)  # meta: no values are drawn
    g.manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    return g


def values(shape: tuple[int, ...], kind: str, g: torch.Generator) -> torch.Tensor:
    """float64 values of one of the VALUES kinds (none on the meta device)."""
    if _DEVICE.get() == "meta":
        return torch.empty(shape, dtype=torch.float64, device="meta")
    x = torch.randn(shape, generator=g, dtype=torch.float64, device=g.device)
    if kind == "normal":
        return x
    if kind == "large":  # exercise overflow paths: x**3, exp(x - max)
        return x * 1e4
    if kind == "small":
        return x * 1e-3
    if kind == "mixed":  # heavy-tailed: mostly O(1), some up to 1e4
        scale = torch.exp(torch.rand(shape, generator=g, dtype=torch.float64, device=g.device) * math.log(1e4))
        return x * scale
    raise ValueError(f"unknown value kind {kind!r}")


def times(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``x * factor``; on the meta device ``x`` itself (the same shape, dtype and strides): PyTorch's meta kernels
    for arithmetic are Python references whose first call imports ``torch._dynamo``, seconds of the grader's one
    interpreter while its runs start."""
    return x if x.is_meta else x * factor


def over(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """``x / divisor``; on the meta device ``x`` itself (see :func:`times`)."""
    return x if x.is_meta else x / divisor


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
        buf = torch.zeros((*shape[:-1], 2 * shape[-1]), dtype=data.dtype, device=data.device)
        view = buf[..., ::2]
        view.copy_(data)
        return view
    if layout == "offset":  # starts one element into its storage
        buf = torch.zeros(data.numel() + 1, dtype=data.dtype, device=data.device)
        view = buf[1:].view(shape)
        view.copy_(data)
        return view
    raise ValueError(f"unknown layout {layout!r}")


def make(shape, dtype: torch.dtype, g: torch.Generator, *, kind="normal", layout="contiguous"):
    """Random tensor of ``dtype`` with a given value kind and memory layout (on ``g``'s device)."""
    data = values(tuple(shape), kind, g).to(dtype)
    return layout_view(data, layout)


def to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    """Copy a tensor to ``device`` keeping its exact strides and storage offset (always a copy)."""
    itemsize = t.element_size()
    n = t.untyped_storage().nbytes() // itemsize
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
    return flat.to(device, copy=True).as_strided(t.shape, t.stride(), t.storage_offset())


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as same-sized integers (a view: an element-size-preserving dtype view works
    for any strides, expanded and offset ones included). Complex and other dtypes without a same-sized
    integer type are returned as they are."""
    t = t.detach()
    if t.dtype.is_complex or t.element_size() not in _INT_OF_SIZE:
        return t
    return t.view(_INT_OF_SIZE[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality, whatever the layouts (NaNs compare equal to themselves)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(as_bits(a.cpu()), as_bits(b.cpu())))


# Memory that a student's call allocates (torch.empty and friends) is filled with these bit patterns while
# it runs (grader.checks.integrity.Monitor), so output elements that no kernel wrote can be told apart from
# computed ones. Each is a *signaling* NaN (quiet bit clear, payload non-zero): arithmetic never produces
# one — an invalid operation gives the quiet default NaN (0x7FC00000 in the interpreter, 0x7FFFFFFF on NVIDIA
# GPUs) and a NaN operand comes out quieted — while loads, stores and copies keep the bits as they are.
UNWRITTEN_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.float64: (torch.int64, 0x7FF4_A5A5_A5A5_A5A5),
    torch.float32: (torch.int32, 0x7FA5_A5A5),
    torch.float16: (torch.int16, 0x7D5A),
    torch.bfloat16: (torch.int16, 0x7FA5),
}


def fill_unwritten(t: torch.Tensor) -> None:
    """Fill a fresh floating-point tensor with its dtype's never-written pattern (other dtypes: untouched)."""
    if t.dtype in UNWRITTEN_BITS and t.numel() > 0 and t.device.type != "meta":
        int_dtype, bits = UNWRITTEN_BITS[t.dtype]
        t.view(int_dtype).fill_(bits)


def unwritten_mask(t: torch.Tensor) -> torch.Tensor | None:
    """Elements that still hold the never-written pattern, or None for a dtype that has none."""
    if t.dtype not in UNWRITTEN_BITS:
        return None
    int_dtype, bits = UNWRITTEN_BITS[t.dtype]
    return t.detach().view(int_dtype) == bits  # same element size: a valid view for any strides


def raw_bytes(t: torch.Tensor) -> bytes:
    """The elements' bytes in row-major order, whatever the layout (sizes 0 and 1, zero strides, offsets)."""
    return row_major_bytes(t).tobytes()


def row_major_bytes(t: torch.Tensor) -> memoryview:
    """:func:`raw_bytes` without a copy where ``t`` is a dense row-major CPU tensor already (to hash it)."""
    if t.numel() == 0:
        return memoryview(b"")
    flat = t.detach().cpu().reshape(-1)
    if flat.stride(0) != 1:  # a view that steps over elements (a size-1 tensor may keep any stride)
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return memoryview(flat.view(torch.uint8).numpy())


def device_inputs(inputs: Mapping[str, Any], device: str) -> dict[str, Any]:
    """Fresh copies of the tensor inputs on ``device``, with their strides and storage offsets."""
    return {k: to_device(v, device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
