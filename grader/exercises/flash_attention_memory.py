"""FlashAttention's extra check ``memory``: the forward must not materialize the Nq×Nk score matrix.

One long causal head (N = 16384 on the GPU, 1024 in the interpreter) runs through the student's forward while every
tensor it creates is counted (and, on CUDA, its peak memory above the inputs); a quarter of one 16-bit N×N matrix
or more fails.
"""

from __future__ import annotations

import torch

from grader.checks import integrity, tensors
from grader.checks.spec import ExtraCheck, Observation
from grader.checks.verdicts import Verdict

MEMORY_N = {"cuda": 16384, "cpu": 1024}
MEMORY_POINTS = 3


def _memory_shape(device: str) -> tuple[int, int, torch.dtype]:
    n = MEMORY_N["cuda" if device == "cuda" else "cpu"]
    return (n, 64, torch.bfloat16) if device == "cuda" else (n, 16, torch.float16)


def execute_memory(module, device: str) -> dict:
    """Run the causal forward on one long head (N = 16384 on the GPU, 1024 in the interpreter; D = 64 / 16)
    and record the bytes of all tensors it creates (every device) and its peak memory above the inputs
    (CUDA)."""
    n, d, dtype = _memory_shape(device)
    g = tensors.generator(n)
    q, k, v = (torch.randn((1, 1, n, d), generator=g).to(dtype).to(device) for _ in range(3))
    call = lambda: module.flash_attention_forward(q, k, v, is_causal=True, scale=None)  # causal: half the time
    try:
        peak = 0
        if device == "cuda":
            call()  # compile and autotune outside the measurement
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        with integrity.monitor() as seen:  # the ops it dispatches outside Triton launches, with their allocations
            call()
        if device == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
    except NotImplementedError:
        raise
    except Exception as exc:
        return {"allocated": 0, "peak": 0, "error": f"{type(exc).__name__}: {exc}"}
    return {"allocated": int(seen.allocated_bytes), "peak": int(peak), "error": None}


def judge_memory(observation: Observation, device: str) -> Verdict:
    """Fail at a quarter of a 16-bit N×N score matrix or more."""
    n, d, _ = _memory_shape(device)
    if observation["error"] is not None:
        return Verdict(False, f"flash_attention_forward raised {observation['error']} on q, k, v of shape "
                              f"(1, 1, {n}, {d})")
    budget = n * n * 2 // 4
    allocated, peak = observation["allocated"], observation["peak"]
    worst = max(allocated, peak)
    if worst < budget:
        return Verdict(True)
    what = "allocated" if allocated >= peak else "raised peak GPU memory by"
    return Verdict(False, f"flash_attention_forward {what} {worst / 2**20:.1f} MiB for Nq = Nk = {n}, D = {d}, "
                          f"one head; the limit is {budget / 2**20:.1f} MiB (a quarter of one 16-bit "
                          f"{n}×{n} score matrix). FlashAttention keeps score tiles on chip: never write S or "
                          "P to memory")


MEMORY_CHECK = ExtraCheck(
    name="memory",
    description="a long sequence must not allocate an Nq×Nk score matrix",
    execute=execute_memory,
    judge=judge_memory,
    fields={"allocated": int, "peak": int, "error": (str, type(None))},
    points=MEMORY_POINTS,
)
