"""The grader builds inputs without values (the meta device) for two things: counting a benchmark's bytes and FLOPs,
and the signatures of a worker's upcoming cases, which it compiles ahead. Both must describe the real inputs
exactly, and neither may reach PyTorch's Python meta kernels for arithmetic: their first call imports
``torch._dynamo``, which took 7 s of the grader's one interpreter while a submission's runs started (an H100
host, 2026-11-27)."""

from __future__ import annotations

import subprocess
import sys

import torch

from grader import exercises
from grader.checks import tensors
from grader.grading.exercise_run import item_plan


def _cases(name: str):
    items = item_plan.plan(exercises.get(name), device="cuda", secret="meta-test", random_cases=4, speed_budget_s=1.0)
    return [it for it in items if it.case is not None and it.role not in ("bad_input", "speed")]


def _layout(value):
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.stride(), value.storage_offset(), value.dtype
    return value


def test_every_case_built_without_values_has_the_real_inputs_shapes_strides_and_dtypes():
    checked = 0
    for ex in exercises.all_exercises():
        for item in _cases(ex.name):
            with tensors.generated_on("meta"):
                meta = item.part.make_inputs(item.case)
            real = item.part.make_inputs(item.case)
            assert all(v.is_meta for v in meta.values() if isinstance(v, torch.Tensor)), item.id
            assert {k: _layout(v) for k, v in meta.items()} == {k: _layout(v) for k, v in real.items()}, item.id
            checked += 1
    assert checked > 100


def test_building_inputs_without_values_never_imports_torch_dynamo():
    """In a fresh interpreter (this one may have imported it already): every exercise's benchmarks and cases built
    on the meta device leave ``torch._dynamo`` unimported. ``tensors.times`` / ``tensors.over`` keep the specs'
    arithmetic off the meta device."""
    code = """
import sys
from grader import exercises
from grader.checks import tensors
from tests.checks.test_meta_inputs import _cases
for ex in exercises.all_exercises():
    for part in ex.parts:
        for bench in part.benchmarks:
            with tensors.generated_on("meta"):
                part.make_inputs(bench.case)
    for item in _cases(ex.name):
        with tensors.generated_on("meta"):
            item.part.make_inputs(item.case)
    assert "torch._dynamo" not in sys.modules, f"{ex.name}'s inputs imported torch._dynamo"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_times_and_over_compute_on_real_tensors_and_keep_meta_ones_as_they_are():
    x = torch.arange(4, dtype=torch.float64)
    assert torch.equal(tensors.times(x, 3.0), x * 3.0) and torch.equal(tensors.over(x, 3.0), x / 3.0)
    m = torch.empty(4, 2, dtype=torch.float64, device="meta").t()
    assert tensors.times(m, 3.0) is m and tensors.over(m, 3.0) is m
