"""GPU acceptance (``pytest -m gpu``): the reference solutions are right where the interpreter never runs them —
at the benchmark sizes they are timed at, in bf16 and fp16, on transposed inputs — judged exactly as the grader
judges a submission (float64 reference on the CPU, the spec's GPU tolerances); the students' tests pass on them
compiled for the GPU; and FlashAttention's autotuner keeps fp32 calls apart from bf16 ones. Skipped on a CPU (the
check of the case list itself runs everywhere)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from grader import exercises
from grader.checks import loader, verdicts
from grader.checks.spec import Case
from grader.exercises import flash_attention as fa_spec

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"


def _fa(lead, nq, nk, d, dtype, causal) -> Case:
    return Case({"lead": lead, "nq": nq, "nk": nk, "d": d, "dtype": dtype, "causal": causal, "values": "normal",
                 "scale": None, "layout": "contiguous"})


def _mm(m, n, k, dtype, layout_a="contiguous", layout_b="contiguous", activation=None) -> Case:
    return Case({"M": m, "N": n, "K": k, "dtype": dtype, "layout_a": layout_a, "layout_b": layout_b,
                 "activation": activation})


def _rms(shape, dtype) -> Case:
    return Case({"shape": shape, "dtype": dtype, "layout": "contiguous", "values": "normal", "eps": 1e-6})


# GPU-sized cases that neither the examples nor the benchmarks cover: 16-bit types with transposed operands,
# TF32, lengths that are no multiple of any tile, Nq ≠ Nk.
EXTRA_CASES = [
    ("matmul", "forward", _mm(4096, 4096, 4096, "float16", "transposed", activation="gelu")),
    ("matmul", "forward", _mm(2048, 2048, 2048, "float32")),
    ("matmul", "forward", _mm(2000, 3000, 1500, "bfloat16", "transposed", activation="gelu")),
    ("matmul", "forward", _mm(1024, 1040, 1000, "float16", layout_b="transposed")),
    ("rmsnorm", "forward", _rms((3, 16384), "float16")),
    ("rmsnorm", "backward", _rms((3, 16384), "float16")),
    ("rmsnorm", "backward", _rms((1000, 7), "float32")),
    *[("flash_attention", part, _fa(lead, nq, nk, d, dtype, causal))
      for part in ("forward", "autograd")
      for dtype in ("bfloat16", "float16")
      for lead, nq, nk, d, causal in (((2, 3), 1000, 1000, 64, True), ((1, 4), 777, 1025, 128, False),
                                      ((1, 2), 1, 200, 64, False), ((3,), 130, 130, 32, True))],
]


def _beyond_tolerances(exercise: str, case: Case) -> str | None:
    if exercise == "flash_attention" and max(case["nq"], case["nk"]) > fa_spec.GPU_MAX_N:
        return (f"N = {max(case['nq'], case['nk'])}: the FlashAttention tolerances are calibrated up to N = "
                f"{fa_spec.GPU_MAX_N} on the GPU (and its float64 reference needs ~100 GiB at N = 16384); the "
                "shorter benchmark and the extra cases run the same kernels")
    return None


def _cases() -> list:
    params = []
    for exercise in exercises.all_exercises():
        for part in exercise.parts:
            for bench in part.benchmarks:
                reason = _beyond_tolerances(exercise.name, bench.case)
                params.append(pytest.param(exercise.name, part.name, bench.case,
                                           id=f"{exercise.name}.{part.name}[{bench.label}]",
                                           marks=[pytest.mark.skip(reason=reason)] if reason else []))
    for i, (exercise_name, part_name, case) in enumerate(EXTRA_CASES):
        params.append(pytest.param(exercise_name, part_name, case, id=f"{exercise_name}.{part_name}[extra {i}]"))
    return params


@pytest.mark.gpu
@pytest.mark.parametrize(("exercise_name", "part_name", "case"), _cases())
def test_reference_is_right_at_gpu_sizes(exercise_name: str, part_name: str, case: Case):
    exercise = exercises.get(exercise_name)
    part = exercise.part(part_name)
    assert part.skip(case, "cuda") is None, f"the spec skips this case on the GPU: {part.skip(case, 'cuda')}"
    module = loader.load(SOLUTIONS, exercise, part.functions)
    verdict = verdicts.run_case(part, module, case, "cuda")
    assert verdict.passed, verdict.message


@pytest.mark.gpu
def test_the_students_tests_pass_on_the_references_on_the_gpu():
    """The course staff's check (README) on a GPU: every example, random case (bf16 included), integrity rule, bad
    input and extra check of every exercise, compiled for the GPU instead of interpreted."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "assignments", "--impl", "solutions", "-m", "not speed",
                           "-q", "-p", "no:cacheprovider", "--hypothesis-profile", "ci"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.strip().splitlines()[-1]


def test_every_extra_case_is_in_range():
    """On any machine: the extra cases are ones the spec runs on a GPU (a typo would silently test nothing)."""
    for exercise_name, part_name, case in EXTRA_CASES:
        assert exercises.get(exercise_name).part(part_name).skip(case, "cuda") is None
        assert _beyond_tolerances(exercise_name, case) is None


# ---------------------------------------------------------------------- FlashAttention's autotuning

# The autotuner caches one config per key. Without the element size in the key (tensor descriptors carry no dtype),
# an fp32 call would reuse the tiles tuned for a bf16 call of the same shape, tiles that need more shared memory
# than a GPU has in fp32: the launch would fail with OutOfResources. These calls are big enough to be autotuned.


@pytest.fixture(scope="module")
def fa():
    return loader.load(SOLUTIONS, exercises.get("flash_attention"))


@pytest.mark.gpu
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
