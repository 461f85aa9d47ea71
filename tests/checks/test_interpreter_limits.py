"""What the Triton interpreter cannot do is never charged as the student's wrong result without saying so: a kernel
that would run on a GPU but fails in the interpreter gets a note naming the limit and what to do, in the failing
verdict's message; an honestly wrong kernel gets none, and a passing one is unchanged.

Each student module here is a GeLU written the way a student might, judged in-process as pytest does."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

from grader import exercises
from grader.checks import execute, interpreter_limits, loader, runtime, student_errors, verdicts
from grader.checks.spec import Case

pytestmark = pytest.mark.skipif(runtime.configure().is_cuda, reason="kernels run on the GPU here, not in the "
                                "Triton interpreter (GRADER_DEVICE=cpu runs these)")

GELU = exercises.get("gelu")
PART = GELU.part("forward")
INTERPRETER_NOTE = "note: this is a limit of the Triton interpreter (CPU), not necessarily a bug in your kernel"

MODULE = '''
import torch
import triton
import triton.language as tl
{imports}

C = tl.constexpr(0.7978845608028654)


@triton.jit
def _kernel(x_ptr, y_ptr, n, {params}BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
{body}
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def gelu(x):
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        _kernel[(triton.cdiv(n, 1024),)](x, y, n, {args}BLOCK=1024)
    return y
'''
FP32_TANH = "xf = x.to(tl.float32)\ny = xf / (1.0 + tl.exp(-2.0 * C * (xf + 0.044715 * xf * xf * xf)))"


def _module(tmp_path: Path, body: str, *, imports: str = "", params: str = "", args: str = "") -> ModuleType:
    path = tmp_path / "gelu" / "gelu.py"
    path.parent.mkdir(parents=True)
    path.write_text(MODULE.format(imports=imports, params=params, args=args, body=textwrap.indent(body, "    ")))
    return loader.load(tmp_path, GELU, PART.functions)


def _cases(dtype: str) -> list[Case]:
    return [case for case in PART.examples if case["dtype"] == dtype]


def _verdicts(module: ModuleType, dtype: str) -> list[verdicts.Verdict]:
    return [verdicts.run_case(PART, module, case, "cpu") for case in _cases(dtype)]


# A kernel right on the GPU, and what the interpreter makes of it: (body, imports, params, args, the note's advice).
LIMITS = {
    "libdevice": ("xf = x.to(tl.float32)\ny = 0.5 * xf * (1 + libdevice.tanh(C * (xf + 0.044715 * xf * xf * xf)))",
                  "from triton.language.extra import libdevice", "", "", "libdevice functions"),
    "libdevice-result-used-later": ("xf = x.to(tl.float32)\nt = libdevice.tanh(C * (xf + 0.044715 * xf * xf * xf))\n"
                                    "y = 0.5 * xf + 0.5 * xf * t",
                                    "from triton.language.extra.libdevice import tanh as _t\n"
                                    "from triton.language.extra import libdevice", "", "", "libdevice functions"),
    "cuda-libdevice": ("xf = x.to(tl.float32)\n"
                       "y = 0.5 * xf * (1 + tl.extra.cuda.libdevice.tanh(C * (xf + 0.044715 * xf * xf * xf)))",
                       "", "", "", "tanh() (triton.language.extra.cuda.libdevice) has no implementation"),
    "inline-asm": ("xf = x.to(tl.float32)\nz = C * (xf + 0.044715 * xf * xf * xf)\n"
                   "t = tl.inline_asm_elementwise('tanh.approx.f32 $0, $1;', '=r,r', [z], dtype=tl.float32, "
                   "is_pure=True, pack=1)\ny = 0.5 * xf * (1 + t)", "", "", "", "inline assembly"),
    "float-scalar-to": ("xf = x.to(tl.float32)\nc = scale.to(tl.float32)\n"
                        "y = xf / (1.0 + tl.exp(-2.0 * c * (xf + 0.044715 * xf * xf * xf)))",
                        "", "scale, ", "0.7978845608028654, ", "a float kernel argument stays a plain float"),
    "bool-argument": (f"if exact:\n{textwrap.indent(FP32_TANH, '    ')}\nelse:\n    y = x", "", "exact, ", "True, ",
                      "cannot pass a bool kernel argument"),
}


@pytest.mark.parametrize("name", list(LIMITS))
def test_an_interpreter_limit_raised_in_the_kernel_gets_its_note(tmp_path, name):
    body, imports, params, args, advice = LIMITS[name]
    module = _module(tmp_path, body, imports=imports, params=params, args=args)
    failed = [v for v in _verdicts(module, "float32") if not v.passed]
    assert failed, f"{name}: the interpreter ran it — this kernel no longer shows the limit"
    for verdict in failed:
        assert INTERPRETER_NOTE in verdict.message and advice in verdict.message, verdict.message
        assert verdict.interpreter_limit


def test_a_bf16_constant_without_a_cast_gets_the_cast_advice(tmp_path):
    """``0.5 * x`` on a bf16 ``x`` needs a bf16 constant, which the interpreter cannot make (fp32 runs fine)."""
    module = _module(tmp_path, "y = 0.5 * x * (1.0 + x / (1.0 + tl.abs(x)))")
    failed = [v for v in _verdicts(module, "bfloat16") if not v.passed]
    assert failed and all("cannot make a bfloat16 constant" in v.message and "tl.float32 first" in v.message
                          for v in failed), [v.message for v in failed]


def test_wrong_bf16_results_are_said_to_be_maybe_the_interpreters(tmp_path):
    """The factor in fp32, the last product in bf16: right on a GPU and in fp32, garbage in the interpreter's bf16
    — no exception, only wrong values."""
    module = _module(tmp_path, "xf = x.to(tl.float32)\n"
                               "g = 1.0 / (1.0 + tl.exp(-2.0 * C * (xf + 0.044715 * xf * xf * xf)))\n"
                               "y = x * g.to(x.dtype)")
    assert all(v.passed for v in _verdicts(module, "float32"))
    failed = _verdicts(module, "bfloat16")
    assert failed and not any(v.passed for v in failed)
    for verdict in failed:
        assert verdict.message.endswith(interpreter_limits.BF16_NOTE) and verdict.interpreter_limit, verdict.message


def test_an_honestly_wrong_kernel_gets_no_note_and_a_right_one_is_unchanged(tmp_path):
    wrong_constant = _module(tmp_path / "constant", FP32_TANH.replace("0.044715", "0.05"))
    raising = _module(tmp_path / "raising", "y = x + tl.arange(0, 3)")  # not a power of 2: fails on a GPU too
    for module in (wrong_constant, raising):
        found = _verdicts(module, "float32")
        assert found and not any(v.passed for v in found)
        for verdict in found:
            assert "Triton interpreter" not in verdict.message and not verdict.interpreter_limit, verdict.message
    solution = loader.load(Path(__file__).parents[2] / "solutions", GELU, PART.functions)  # casts to fp32
    for case in PART.examples:  # bf16 and fp16 among them
        verdict = verdicts.run_case(PART, solution, case, "cpu")
        assert verdict.passed and not verdict.message and not verdict.interpreter_limit, case


def _triton_stub(message: str):
    """A function that raises NotImplementedError from a file of triton, as a Triton that removed block pointers
    does (this course's Triton runs them, so the removal is simulated)."""
    where = os.path.join(interpreter_limits.triton_dir() or "", "runtime", "interpreter.py")
    scope: dict = {}
    exec(compile(f"def stub(*args, **kwargs):\n    raise NotImplementedError({message!r})\n", where, "exec"), scope)
    return scope["stub"]


@pytest.mark.parametrize("wrapped", [True, False], ids=["wrapped", "raised-as-is"])
def test_removed_block_pointers_are_a_triton_version_not_an_unwritten_function(tmp_path, monkeypatch, wrapped):
    import triton
    from triton.runtime import interpreter

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_make_block_ptr",
                        _triton_stub("Block pointers have been removed in favor of the tensor descriptor API"))
    monkeypatch.setattr(triton.knobs.compilation, "front_end_debugging", not wrapped)  # True: re-raised unwrapped
    body = ("p = tl.make_block_ptr(x_ptr, shape=(n,), strides=(1,), offsets=(0,), block_shape=(BLOCK,), order=(0,))\n"
            "xf = tl.load(p, boundary_check=(0,)).to(tl.float32)\n"
            "y = xf / (1.0 + tl.exp(-2.0 * C * (xf + 0.044715 * xf * xf * xf)))")
    module = _module(tmp_path / "block_pointers", body)
    case = _cases("float32")[0]
    ex = execute.execute(PART, module, PART.make_inputs(case), "cpu")
    assert ex.error_kind == "exception", ex
    assert "removed block pointers" in (ex.error or "") and "the course's Triton" in (ex.error or ""), ex.error
    stub = tmp_path / "stub" / "gelu" / "gelu.py"  # the student's own NotImplementedError: not written yet
    stub.parent.mkdir(parents=True)
    stub.write_text("def gelu(x):\n    raise NotImplementedError('write gelu')\n")
    ex = execute.execute(PART, loader.load(tmp_path / "stub", GELU, PART.functions), PART.make_inputs(case), "cpu")
    assert (ex.error_kind, ex.error) == ("not_implemented", "write gelu")


def test_no_interpreter_note_where_kernels_ran_on_a_gpu(tmp_path, monkeypatch):
    module = _module(tmp_path, LIMITS["libdevice"][0], imports=LIMITS["libdevice"][1])
    with pytest.raises(Exception) as raised:
        module.gelu(torch.randn(8))
    assert INTERPRETER_NOTE in student_errors.student_traceback(raised.value)
    monkeypatch.delenv("TRITON_INTERPRET")  # as on a GPU, where the same error would be the kernel's own
    assert "Triton interpreter" not in student_errors.student_traceback(raised.value)
    assert interpreter_limits.note(raised.value, interpreter=False) is None
