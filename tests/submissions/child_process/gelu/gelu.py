"""Correct, but leaves two processes running: one in its process group, one in a new process session (setsid)."""
import subprocess
import sys

import torch
import triton
import triton.language as tl

_SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)", "child_process-fixture"]  # findable by its argv
_stay = subprocess.Popen(_SLEEPER)
_escape = subprocess.Popen(_SLEEPER, start_new_session=True)
print(f"child pids: {_stay.pid} {_escape.pid}", flush=True)


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


def gelu(x):
    return _gelu(x)
