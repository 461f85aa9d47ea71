"""Cheating: remembers the result per shape and dtype and replays it for new inputs."""
import torch
import triton
import triton.language as tl


@triton.jit
def _gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = x / (1.0 + tl.exp(-1.5957691216057308 * (x + 0.044715 * x * x * x)))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _gelu(x):
    xc = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = xc.numel()
    _gelu_kernel[(triton.cdiv(n, 1024),)](xc, y, n, BLOCK=1024)
    return y


_cache = {}


def gelu(x):
    key = (tuple(x.shape), x.dtype, x.stride())
    if key not in _cache:
        _cache[key] = _gelu(x)
    return _cache[key].clone()
