"""Before its cases, a worker is sent their inputs without values (the meta device) and compiles their kernels at
once (grader.checks.compile_ahead), where the host has cores to spare (one submission, a server). On a GPU that
is where Triton compiles; here, on the CPU, the grader is made to send the request anyway (the worker then runs the
student's calls on zero-filled inputs in Triton's interpreter), so that the request, its wire form and the
supervisor's handling are exercised with a real sandboxed worker."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from grader import exercises
from grader.checks import tensors
from grader.grading import config
from grader.grading.exercise_run import item_plan, item_requests, supervise
from grader.grading.isolation import protocol, wire

GELU = exercises.get("gelu")
SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"

# The reference, but its process exits when it is called on an input of zeros only: what the compile-ahead
# calls use, and no case of the grader's does.
EXITS_ON_ZEROS = '''

import os as _os

_reference_gelu = gelu


def gelu(x):
    if x.numel() > 1 and not bool(x.any()):
        _os._exit(7)
    return _reference_gelu(x)
'''


# The reference, but its first call decides how every later call scales the output: what a student's code keeps
# from a call (a table filled once, a kernel handle) must come from a case's call, never from a compile-ahead call.
FIRST_CALL_DECIDES = '''

_reference_gelu = gelu
_kept = {}


def gelu(x):
    scale = _kept.setdefault("scale", 1.0 if bool(x.any()) else 0.0)
    return _reference_gelu(x) * scale
'''


def test_the_request_carries_shapes_dtypes_and_strides_and_no_values():
    x = torch.empty(8, 4, dtype=torch.float16, device="meta").t()
    request = protocol.CompileAhead("compile-ahead-forward", "forward", [{"x": x, "scale": 0.5}])
    back = wire.decode(wire.encode(request))
    assert isinstance(back, protocol.CompileAhead) and back.part == "forward"
    (inputs,) = back.signatures
    assert inputs["x"].is_meta and inputs["x"].shape == (4, 8) and inputs["x"].stride() == (1, 4)
    assert inputs["x"].dtype == torch.float16 and inputs["scale"] == 0.5
    assert back.benchmarks is False
    speed = wire.decode(wire.encode(protocol.CompileAhead("a", "forward", [{"x": x}], benchmarks=True)))
    assert speed.benchmarks is True and speed.signatures[0]["x"].is_meta
    reply = wire.decode(wire.encode(protocol.CompiledAhead("compile-ahead-forward", 3, None)))
    assert reply == protocol.CompiledAhead("compile-ahead-forward", 3, None)
    with pytest.raises(protocol.ProtocolError, match="signatures"):
        wire.decode({"type": "compile_ahead", "id": "a", "part": "forward", "signatures": "x", "benchmarks": False})
    with pytest.raises(protocol.ProtocolError, match="benchmarks"):
        wire.decode({"type": "compile_ahead", "id": "a", "part": "forward", "signatures": [], "benchmarks": 1})
    with pytest.raises(protocol.ProtocolError, match="kernels"):
        wire.decode({"type": "compiled_ahead", "id": "a", "kernels": "3", "error": None})


def test_a_worker_compiles_ahead_each_parts_distinct_case_signatures_then_its_benchmarks():
    """On a GPU, what a FlashAttention worker is asked to compile ahead: per part, one call per distinct shape,
    dtype and layout of its cases; then, for the parts whose speed is graded, their benchmarks, to compile as the
    speed measurement does. All on the meta device (no values). Nothing for a part whose module did not load."""
    fa = exercises.get("flash_attention")
    items = item_plan.plan(fa, device="cuda", secret="s", random_cases=4, speed_budget_s=0.1)
    requests = item_requests.ahead_requests(items, {})
    assert [(r.part, r.benchmarks) for r in requests] == [
        ("forward", False), ("backward", False), ("autograd", False), ("forward", True), ("autograd", True)]
    for request in requests:
        part = fa.part(request.part)
        assert all(v.is_meta for sig in request.signatures for v in sig.values() if isinstance(v, torch.Tensor))
        if request.benchmarks:
            with tensors.generated_on("meta"):
                wanted = [tuple(part.make_inputs(b.case)["q"].shape) for b in part.benchmarks]
            assert [tuple(sig["q"].shape) for sig in request.signatures] == wanted
        else:
            shapes = {item_requests.signature(sig) for sig in request.signatures}
            assert len(shapes) == len(request.signatures) > 1
    without = item_requests.ahead_requests(items, {"autograd": "SyntaxError"})
    assert [(r.part, r.benchmarks) for r in without] == [("forward", False), ("backward", False), ("forward", True)]


def _submission(tmp_path: Path, extra: str) -> Path:
    root = tmp_path / "submission"
    shutil.copytree(SOLUTIONS / "gelu", root / "gelu")
    with open(root / "gelu" / "gelu.py", "a") as module:
        module.write(extra)
    return root


@pytest.mark.parametrize("student", ["reference", "exits on zeros", "first call decides"])
def test_a_worker_that_ends_while_compiling_ahead_costs_the_student_nothing(tmp_path, student):
    """The reference's cases all pass after the compile-ahead request. A student whose process exits on the
    zero-filled inputs of that request loses nothing: no check fails, no problem is reported, and a fresh worker
    runs every case (the request is not sent to it again). What the request's calls leave in the student's globals
    never reaches the cases (they call a copy of the module)."""
    settings = replace(config.resolve(config.GradeOptions(random_cases=3, timeout_s=120), config.load_course(),
                                      device="cpu", secret="s", workdir=tmp_path), compile_ahead=True)
    items = [it for it in item_plan.plan(GELU, device="cpu", secret="s", random_cases=3, speed_budget_s=0.1)
             if it.role in ("example", "random")]
    (tmp_path / "scratch").mkdir()
    root = _submission(tmp_path, {"exits on zeros": EXITS_ON_ZEROS, "first call decides": FIRST_CALL_DECIDES}
                       .get(student, ""))
    run = supervise.run(GELU, root, items, settings, scratch=tmp_path / "scratch")
    assert not run.failed and not run.problems, (run.failed, run.problems)
    assert set(run.replies) == {it.id for it in items}
    assert all(isinstance(r, protocol.CaseDone) and r.execution.error is None for r in run.replies.values())
    assert all(any(bool(out.any()) for out in r.execution.outputs.values()) for r in run.replies.values())
    assert run.profile[supervise.COMPILING_AHEAD] > 0
    ended_ahead = [log for log in run.logs if "ended while compiling ahead" in log]
    assert len(ended_ahead) == (1 if student == "exits on zeros" else 0), run.logs  # for the course staff
    assert len(run.logs) == 1 + len(ended_ahead)


@pytest.mark.gpu
def test_on_a_gpu_the_cases_kernels_compile_ahead_and_the_cases_compile_nothing_more(tmp_path, monkeypatch):
    """As the worker does it: the reference GeLU's examples, compiled ahead through a copy of the module (its kernel
    once per dtype and block size); the cases then run on the module itself, find every kernel in the Triton cache
    on disk (no new cubin), and pass."""
    from grader.checks import compile_ahead, execute, loader, specialization, tensors

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: Triton compiles only there (the interpreter has nothing to compile)")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    assert specialization.install()
    part = GELU.part("forward")
    module = loader.load(SOLUTIONS, GELU, part.functions)
    ahead = loader.load(SOLUTIONS, GELU, part.functions, copy="_compile_ahead")
    assert ahead is not module and ahead._gelu_kernel is not module._gelu_kernel
    with tensors.generated_on("meta"):
        signatures = [part.make_inputs(case) for case in part.examples]
    kernels, error = compile_ahead.compile_calls(part, ahead, signatures, "cuda")
    dtypes = {str(case["dtype"]) for case in part.examples}
    assert error is None and kernels >= len(dtypes), (kernels, dtypes)  # a kernel per dtype and block size

    def cubins() -> int:
        return len(list((tmp_path / "triton-cache").rglob("*.cubin")))

    before = cubins()
    assert before == kernels
    for case in part.examples:
        with specialization.generic():
            ran = execute.execute(part, module, part.make_inputs(case), "cuda")
        assert ran.error is None and ran.outputs
    assert cubins() == before
