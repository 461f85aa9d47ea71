"""A fault costs only its own check: an exception (NotImplementedError included) fails the check that raised it and
the next check runs; a crash fails the check that caused it and the part goes on in a fresh worker, however many
checks crash; Triton compiling the student's kernels is not counted in a call's time limit."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from grader.grading import config
from grader.grading.commands import grade as grade_cmd
from grader.grading.exercise_run import supervise
from grader.grading.results.results import FAILED, GRADED, PASSED

from ...sandboxing import sandbox_options

REPO = Path(__file__).parents[3]
GELU = (REPO / "solutions" / "gelu" / "gelu.py").read_text()


def _submission(tmp_path: Path, name: str, source: str) -> Path:
    folder = tmp_path / name / "gelu"
    folder.mkdir(parents=True)
    (folder / "gelu.py").write_text(source)
    return folder.parent


def _gelu_forward(tmp_path: Path, source: str, **options):
    settings = {"exercises": ("gelu",), "random_cases": 0, "secret": "fault-scope", **sandbox_options(), **options}
    batch = grade_cmd.grade([str(_submission(tmp_path, "student", source))], out=tmp_path / "out",
                            options=config.GradeOptions(**settings))
    (report,) = batch.reports
    ((_, result),) = report.exercises
    return result, result.parts[0]


def _dtype(check) -> str:
    return (check.case or {}).get("params", {}).get("dtype", "")


def test_an_option_left_unimplemented_fails_its_own_checks_and_the_others_run(tmp_path):
    """NotImplementedError for one dtype: those checks fail saying so, every other check runs and passes, and the
    part is graded (not "not implemented")."""
    source = GELU + '''

_gelu = gelu


def gelu(x):
    if x.dtype == torch.bfloat16:
        raise NotImplementedError("bfloat16 is not supported yet")
    return _gelu(x)
'''
    _, part = _gelu_forward(tmp_path, source)
    assert part.status == GRADED, part.message
    correctness = [c for c in part.checks if c.role in ("example", "random")]
    bf16 = [c for c in correctness if _dtype(c) == "bfloat16"]
    others = [c for c in correctness if _dtype(c) != "bfloat16"]
    assert bf16 and others
    assert all(c.status == FAILED and "NotImplementedError: bfloat16 is not supported yet" in c.message for c in bf16)
    assert all(c.status == PASSED for c in others), [(c.label, c.message) for c in others if not c.passed]
    integrity = [c for c in part.checks if c.role == "integrity"]
    assert integrity and all(c.status == PASSED for c in integrity), [c.message for c in integrity]
    assert not part.flags


def test_an_untouched_stub_is_still_not_implemented(tmp_path):
    stub = (REPO / "assignments" / "gelu" / "gelu.py").read_text()
    _, part = _gelu_forward(tmp_path, stub)
    assert part.status == "not implemented" and "is not implemented yet" in part.message


@pytest.mark.slow
def test_every_crash_costs_its_own_check_only(tmp_path):
    """A kernel that kills its process on every half-precision call: each of those checks fails with the crash, in
    a fresh worker each time, and every float32 check after them still runs and passes — four crashes and more,
    with no count after which the rest of the part is lost."""
    source = GELU + '''

_gelu = gelu


def gelu(x):
    if x.dtype != torch.float32:
        import os

        os._exit(3)
    return _gelu(x)
'''
    _, part = _gelu_forward(tmp_path, source)
    correctness = [c for c in part.checks if c.role in ("example", "random")]
    crashed = [c for c in correctness if _dtype(c) != "float32"]
    fp32 = [c for c in correctness if _dtype(c) == "float32"]
    assert len(crashed) >= 4 and fp32
    assert all(c.status == FAILED and "exited early (exit code 3)" in c.message for c in crashed)
    assert all(c.status == PASSED for c in fp32), [(c.label, c.message) for c in fp32 if not c.passed]
    assert not [c for c in part.checks if "not run" in c.message]


def _item(part: str, kind: str, n: int) -> SimpleNamespace:
    return SimpleNamespace(part=PARTS[part], kind=kind, id=f"{kind}{n}")


PARTS = {"forward": SimpleNamespace(name="forward"), "backward": SimpleNamespace(name="backward")}


def test_after_a_crash_the_other_kinds_of_check_go_first():
    """So that a kind of check that crashes on every call cannot use up the time the others need (the memory check,
    the integrity cases)."""
    items = [_item("forward", kind, n) for n, kind in enumerate(["random", "random", "bad_input", "random",
                                                                  "memory", "integrity"])]
    items.append(_item("backward", "random", 9))
    order = supervise.after_crash(items[1:], items[0])
    assert [it.id for it in order] == ["bad_input2", "memory4", "integrity5", "random9", "random1", "random3"]
    assert supervise.after_crash(items, None) == items


SLOW_COMPILE = GELU + '''

import time

import triton.compiler
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


class _SlowSource(ASTSource):
    """Stands in for a kernel whose compilation takes a while (Triton asks a source for its options first)."""

    def __init__(self):
        pass

    def parse_options(self):
        time.sleep(15.0)
        raise RuntimeError("not a kernel")


_gelu = gelu
_compiled = []


def gelu(x):
    if not _compiled and x.shape == (1,):  # one shape's first call compiles, as a kernel's first call does
        _compiled.append(True)
        try:
            triton.compiler.compile(_SlowSource(), target=GPUTarget("cuda", 80, 32))
        except RuntimeError:
            pass
    return _gelu(x)
'''


def test_compiling_is_not_counted_in_a_calls_time_limit(tmp_path):
    """One call spends 15 s inside Triton's compiler against a 10 s limit per call: it passes, and the report
    tells how long compiling took."""
    result, part = _gelu_forward(tmp_path, SLOW_COMPILE, call_timeout_s=10.0, timeout_s=600.0)
    examples = [c for c in part.checks if c.role == "example"]
    assert examples and all(c.status == PASSED for c in examples), [(c.label, c.message) for c in examples]
    assert any("compiling _SlowSource took" in note and "not counted in the 10 s limit" in note
               for note in result.notes), result.notes


def test_a_compilation_has_a_limit_of_its_own(tmp_path):
    course = tmp_path / "course.toml"
    course.write_text(config.COURSE_FILE.read_text().replace("compile_timeout_s = 600", "compile_timeout_s = 2"))
    _, part = _gelu_forward(tmp_path, SLOW_COMPILE, call_timeout_s=10.0, timeout_s=600.0, course=course)
    first, *rest = [c for c in part.checks if c.role == "example"]
    assert first.status == FAILED and "compiling _SlowSource took longer than the 2 s allowed" in first.message
    assert rest and all(c.status == PASSED for c in rest)  # in a fresh worker


def test_a_compilation_is_described_by_its_kernel_and_constants():
    from grader.grading.isolation import compile_clock

    fn = type("Fn", (), {"__name__": "_softmax_kernel", "arg_names": ["x_ptr", "n_cols", "BLOCK_N"]})()
    src = type("Src", (), {"fn": fn, "constexprs": {(2,): 65536}})()
    assert compile_clock.describe(src) == "_softmax_kernel (BLOCK_N=65536)"
    assert compile_clock.describe(object()) == "object"
    events = []
    clock = compile_clock.CompileClock(lambda what: events.append(("start", what)),
                                       lambda seconds: events.append(("end", seconds >= 0)))
    inner = clock.wrap(lambda src, **kw: clock.wrap(lambda s, **k: "compiled")(src))  # nested: counted once
    assert inner(src) == "compiled"
    assert events == [("start", "_softmax_kernel (BLOCK_N=65536)"), ("end", True)]
