"""Exercise 2: a fused softmax kernel in Triton. Read assignments/softmax/README.md first.

Fill in the kernel(s) and ``softmax``. Keep the name and signature of ``softmax``. Rows longer than
what fits in one block need a loop over the row (see "Long rows" in the handout): fill in
``_softmax_online_kernel`` for those, or fold both into one kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_row_kernel(x_ptr, y_ptr, n_cols, stride_xm, stride_xn, stride_ym, BLOCK_SIZE: tl.constexpr):
    """One program per row; the whole row (n_cols ≤ BLOCK_SIZE) is held in registers."""
    # TODO: load the row (masked lanes must not change the max or the sum), subtract the max,
    # exponentiate, divide by the sum, store.
    pass


@triton.jit
def _softmax_online_kernel(x_ptr, y_ptr, n_cols, stride_xm, stride_xn, stride_ym, BLOCK_SIZE: tl.constexpr):
    """One program per row, looping over the row in blocks (rows longer than one block)."""
    # TODO: pass 1 keeps a running max m and a running sum d of exp(x - m) (rescale d when m grows);
    # pass 2 writes exp(x - m) / d.
    pass


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, with the semantics of ``torch.softmax(x, dim=-1)``."""
    raise NotImplementedError("softmax is not implemented yet — see assignments/softmax/README.md")
