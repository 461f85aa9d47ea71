"""GeLU that computes the tanh argument z in the input's own dtype (no cast to float32 before the arithmetic;
only exp, which needs float32, gets one). Rounding z to float16 moves y by more than the float16 tolerance on
small negative inputs, on any device: a real precision bug. Rounding it to bfloat16 does the same on a GPU; the
Triton interpreter cannot run that bfloat16 arithmetic at all, so there the bfloat16 cases fail with an
interpreter note.

status: forward: graded
passes: forward.examples[dtype=float32]
fails: forward.examples[dtype=float16]: differ
cpu-only: fails: forward.examples[dtype=bfloat16]: .
cpu-only: note: forward.examples[dtype=bfloat16]: interpreter
gpu-only: fails: forward.examples[dtype=bfloat16]: differ
passes: forward.integrity
flags: none
all-checks-run
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gelu_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    # z = sqrt(2/pi) * (x + 0.044715 x^3), kept in x's dtype (half the registers for bf16)
    z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    # 0.5 x (1 + tanh(z)) = x / (1 + exp(-2z)); exp only takes fp32
    y = x / (1.0 + tl.exp(-2.0 * z.to(tl.float32)))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def gelu(x: torch.Tensor) -> torch.Tensor:
    xc = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = xc.numel()
    if n == 0:
        return out
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)
    _gelu_kernel[grid](xc, out, n, BLOCK_SIZE=1024)
    return out
