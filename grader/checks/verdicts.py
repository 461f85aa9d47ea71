"""Verdicts: the half of every check that needs no student code. Given the inputs a check was run on and
what :mod:`grader.checks.execute` recorded, compute the float64 reference and decide.

These are the only implementations of the correctness, integrity and bad-input rules; pytest calls them
in the same process right after executing, the grader in its verdict process, which never imports the
student's module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from grader.checks import integrity, interpreter_limits, tensors
from grader.checks.call_records import BadInputOutcome, Execution
from grader.checks.compare import compare, describe_tensor, inputs_contiguous, layout_hint
from grader.checks.execute import execute, execute_bad_input, qualname
from grader.checks.spec import BadInput, Case, Inputs, Part


@dataclass
class Verdict:
    passed: bool
    message: str = ""
    flags: list[integrity.Flag] = field(default_factory=list)
    interpreter_limit: bool = False  # the failure may be a limit of the Triton interpreter (the message says which)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "message": self.message, "flags": [f.to_dict() for f in self.flags],
                "interpreter_limit": self.interpreter_limit}


def describe_case(case: Case, inputs: Inputs) -> str:
    lines = [f"case {case!r}"]
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            lines.append(f"  {name}: {describe_tensor(value)}")
    return "\n".join(lines)


def correctness(part: Part, case: Case, inputs: Inputs, ex: Execution, device: str, *,
                reference: Callable[[], Mapping[str, torch.Tensor]] | None = None) -> Verdict:
    """Every output of one execution against the float64 reference of ``inputs`` (``reference()`` where given:
    the batch's stored one; computed only when there are outputs to compare)."""
    function = part.functions[0]
    if ex.error_kind is not None:
        if ex.error_kind == "not_implemented":  # an option left unimplemented: this check fails, the others run
            return Verdict(False, f"{function} raised NotImplementedError" + (f": {ex.error}" if ex.error else ""))
        message = f"{function} raised {ex.error}" if ex.error_kind == "exception" else ex.error or ""
        return Verdict(False, message, interpreter_limit=interpreter_limits.mentions_limit(ex.error))
    if ex.outputs is None:
        return Verdict(False, f"{function} returned no outputs")
    expected = reference() if reference is not None else part.reference(inputs)
    sizes = [n for v in inputs.values() if isinstance(v, torch.Tensor) for n in v.shape]  # what a hint may rule out
    problems, wrong_values = [], False
    for name, exp in expected.items():
        if name not in ex.outputs:
            problems.append(f"{name}: missing from the result")
            continue
        if ex.output_devices.get(name) != device:
            problems.append(f"{name}: on {ex.output_devices.get(name)}, expected on {device}")
            continue
        mismatch = compare(name, ex.outputs[name], exp, part.tolerance(name, case.dtype, device), sizes=sizes)
        if mismatch:
            problems.append(mismatch.message)
            wrong_values = True
    if not problems:
        return Verdict(True)
    message = f"{function} is wrong on\n{describe_case(case, inputs)}\n" + "\n".join(problems)
    # On the CPU kernels run in the Triton interpreter, whose bf16 arithmetic is wrong without an fp32 cast: say
    # so on every wrong bf16 result (fp16 it computes right), rather than guess from the values.
    if wrong_values and device == "cpu" and any(
            isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 for v in inputs.values()):
        return Verdict(False, f"{message}\n{interpreter_limits.BF16_NOTE}", interpreter_limit=True)
    return Verdict(False, message)


def integrity_flags(part: Part, inputs: Inputs, ex: Execution, *, student_dir: str) -> list[integrity.Flag]:
    """The integrity rules for one call that returned: own Triton kernel, no PyTorch compute, inputs kept,
    no aliasing."""
    function = part.functions[0]
    flags = integrity.flags_for(
        integrity.Observation(ex.ops, ex.kernels),
        function=function,
        student_dir=student_dir,
        allowed_ops=part.allowed_ops,
    )
    changed = [
        name for name, before in inputs.items()
        if isinstance(before, torch.Tensor)
        and (name not in ex.inputs_after or not tensors.same_bits(before, ex.inputs_after[name]))
    ]
    if changed:
        flags.append(integrity.Flag(
            "inputs-unchanged",
            f"{function} modified its input(s) {', '.join(changed)} in place — write results to a new tensor",
        ))
    if ex.aliased:
        flags.append(integrity.Flag(
            "no-aliasing", f"{function} returned output(s) sharing memory with inputs: {', '.join(ex.aliased)}"
        ))
    return flags


def integrity_verdict(part: Part, inputs: Inputs, ex: Execution, *, student_dir: str) -> Verdict:
    """The integrity check of one call: it must return, and raise no integrity flag."""
    if ex.error_kind is not None:
        return Verdict(False, f"{part.functions[0]} could not be checked: {ex.error}")
    flags = integrity_flags(part, inputs, ex, student_dir=student_dir)
    if not flags:
        return Verdict(True)
    return Verdict(False, "\n".join(f"[{f.rule}] {f.message}" for f in flags), flags)


def bad_input(bad: BadInput, outcome: BadInputOutcome) -> Verdict:
    """The call must raise one of ``bad.raises`` with a message matching ``bad.match``."""
    expected = " or ".join(e.__name__ for e in bad.raises)
    if outcome.raised is None:
        return Verdict(False, f"{bad.function} ({bad.label}) returned normally — expected it to raise {expected}")
    if not any(qualname(cls) in outcome.raised_types for cls in bad.raises):
        return Verdict(False, f"{bad.function} ({bad.label}) raised {outcome.raised}: {outcome.message} — "
                              f"expected {expected}")
    if bad.match and not re.search(bad.match, outcome.message, re.IGNORECASE):
        return Verdict(False, f"{bad.function} ({bad.label}) raised {outcome.raised}: {outcome.message} — "
                              f"the message should mention {bad.match!r}")
    return Verdict(True)


# ------------------------------------------------------------------ execute + judge in one process


def run_case(part: Part, module: ModuleType, case: Case, device: str) -> Verdict:
    """Build the case's inputs, run the student's code and judge it (the pytest path)."""
    inputs = part.make_inputs(case)
    return correctness(part, case, inputs, execute(part, module, inputs, device), device)


def examples_layout_hint(part: Part, module: ModuleType, device: str) -> str | None:
    """The layout hint (:func:`grader.checks.compare.layout_hint`) from all of the part's examples: what a
    single failing example cannot tell (pytest runs each example as its own test)."""
    outcomes = []
    for case in part.examples:
        if part.skip(case, device) is None:
            inputs = part.make_inputs(case)
            verdict = correctness(part, case, inputs, execute(part, module, inputs, device), device)
            outcomes.append((inputs_contiguous(inputs), verdict.passed))
    return layout_hint(outcomes)


def run_integrity(part: Part, module: ModuleType, case: Case, device: str, *, student_dir: str) -> Verdict:
    inputs = part.make_inputs(case)
    return integrity_verdict(part, inputs, execute(part, module, inputs, device), student_dir=student_dir)


def run_bad_input(module: ModuleType, bad: BadInput, device: str) -> Verdict:
    return bad_input(bad, execute_bad_input(module, bad, device))
