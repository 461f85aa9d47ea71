"""GPU-only checks of the reference FlashAttention's autotuning, which the interpreter never runs.

The autotuner caches one config per key. Its key once lacked the input dtype (tensor descriptors carry
none), so an fp32 call reused the tiles tuned for a bf16 call of the same shape, tiles that need more
shared memory than a GPU has in fp32: the launch failed with OutOfResources. These calls are big enough
to be autotuned (``AUTOTUNE_MIN_WORK``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from grader import exercises
from grader.checks import loader

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: the Triton autotuner runs only there, not in the interpreter")

SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"


@pytest.fixture(scope="module")
def fa():
    return loader.load(SOLUTIONS, exercises.get("flash_attention"))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_fp32_after_bf16_at_the_same_shape(fa, causal):
    shape = (1, 16, 4096, 128)  # batch · Nq · Nk · D = 3.4e10 >= AUTOTUNE_MIN_WORK: autotuned
    assert shape[0] * shape[1] * shape[2] ** 2 * shape[3] >= fa.AUTOTUNE_MIN_WORK
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float32, 1e-2)):  # fp32 tl.dot is TF32 on the GPU
        q, k, v, do = (torch.randn(shape, device="cuda", generator=g, dtype=dtype) for _ in range(4))
        inputs = [t.requires_grad_(True) for t in (q, k, v)]
        o = fa.flash_attention(q, k, v, causal)
        grads = torch.autograd.grad(o, inputs, do)
        ref_inputs = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*ref_inputs, is_causal=causal)
        ref_grads = torch.autograd.grad(ref, ref_inputs, do.double())
        for name, got, want in zip(("o", "dq", "dk", "dv"), (o, *grads), (ref, *ref_grads)):
            err = (got.double() - want).abs().max().item()
            assert err <= tol * (1 + want.abs().max().item()), f"{dtype} {name}: max |error| {err:.3g}"
