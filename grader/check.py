"""Run one case of one part, and judge it: the single implementation of every correctness and
integrity check, shared by the pytest path and the grader.

The work is split in two so the grader can put a process boundary in between:

* :func:`execute` runs in the process that imported the student's module. It builds the inputs from
  the case, calls the student's API under the integrity monitor and returns raw observations
  (outputs copied to the CPU, ops, kernel launches, inputs after the call, aliasing).
* :func:`judge` needs only the case and those observations. It rebuilds the inputs, computes the
  float64 reference and returns the verdict. It never touches student code.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from grader import integrity, tensors
from grader.compare import compare, describe_tensor
from grader.spec import Case, Exercise, Part


@dataclass
class Execution:
    """What one call of the student's code produced; plain data (picklable, torch.save-able)."""

    outputs: dict[str, torch.Tensor] | None = None  # CPU copies
    output_devices: dict[str, str] = field(default_factory=dict)
    error_kind: str | None = None  # "not_implemented" | "exception" | "bad_output"
    error: str | None = None
    ops: list[str] = field(default_factory=list)
    kernels: list[tuple[str, str]] = field(default_factory=list)
    inputs_after: dict[str, torch.Tensor] = field(default_factory=dict)  # CPU copies of tensor inputs
    aliased: list[str] = field(default_factory=list)  # "output <- input" pairs sharing memory


@dataclass
class Verdict:
    passed: bool
    message: str = ""
    flags: list[integrity.Flag] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "message": self.message, "flags": [f.to_dict() for f in self.flags]}


@contextlib.contextmanager
def poisoned_allocations():
    """Make ``torch.empty`` fill with NaN so unwritten output elements show up (and say so)."""
    import torch.utils.deterministic as det

    was_det = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    try:
        yield
    finally:
        det.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_det, warn_only=was_warn)


def device_inputs(inputs: dict[str, Any], device: str) -> dict[str, Any]:
    return {k: tensors.to_device(v, device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def execute(part: Part, module: ModuleType, case: Case, device: str) -> Execution:
    """Call the student's code on the case's inputs and record everything the judge needs."""
    inputs = part.make_inputs(case)
    dev_inputs = device_inputs(inputs, device)
    ex = Execution()
    try:
        with poisoned_allocations(), integrity.monitor() as obs:
            try:
                outputs = part.call(module, dev_inputs)
            finally:
                if device == "cuda":
                    torch.cuda.synchronize()
    except NotImplementedError as exc:
        ex.error_kind, ex.error = "not_implemented", str(exc)
        return ex
    except Exception as exc:  # the student's exception is the result we report
        ex.error_kind, ex.error = "exception", _format_exception(exc)
        return ex
    ex.ops, ex.kernels = list(obs.ops), list(obs.kernels)
    if not isinstance(outputs, dict) or not all(isinstance(v, torch.Tensor) for v in outputs.values()):
        ex.error_kind, ex.error = "bad_output", f"expected tensors, got {_type_summary(outputs)}"
        return ex
    ex.outputs = {k: v.detach().cpu().clone() for k, v in outputs.items()}
    ex.output_devices = {k: str(v.device.type) for k, v in outputs.items()}
    ex.inputs_after = {k: v.detach().cpu().clone() for k, v in dev_inputs.items() if isinstance(v, torch.Tensor)}
    ex.aliased = [
        f"{o} <- {i}"
        for o, ov in outputs.items()
        for i, iv in dev_inputs.items()
        if isinstance(iv, torch.Tensor) and integrity.storages_overlap(ov, iv)
    ]
    return ex


_INTERNAL = (os.path.dirname(os.path.abspath(__file__)) + os.sep, f"{os.sep}triton{os.sep}", f"{os.sep}torch{os.sep}")


def _format_exception(exc: BaseException) -> str:
    """The exception and the last few frames of the student's own code (not ours, triton's, torch's)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not any(p in f.filename for p in _INTERNAL)]
    frames = frames[-3:]
    where = "".join(traceback.format_list(frames)).rstrip()
    return f"{type(exc).__name__}: {exc}\n{where}"


def _type_summary(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {type(v).__name__}" for k, v in value.items()) + "}"
    return type(value).__name__


def describe_case(case: Case, inputs: dict[str, Any]) -> str:
    lines = [f"case {case!r}"]
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            lines.append(f"  {name}: {describe_tensor(value)}")
    return "\n".join(lines)


def judge(part: Part, case: Case, ex: Execution, device: str, *, function: str | None = None) -> Verdict:
    """Correctness verdict for one execution: every output against the float64 reference."""
    function = function or part.functions[0]
    if ex.error_kind is not None:
        return Verdict(False, f"{function} raised {ex.error}" if ex.error_kind == "exception" else ex.error or "")
    inputs = part.make_inputs(case)
    expected = part.reference(inputs)
    assert ex.outputs is not None
    problems = []
    for name, exp in expected.items():
        if name not in ex.outputs:
            problems.append(f"{name}: missing from the result")
            continue
        if ex.output_devices.get(name) != device:
            problems.append(f"{name}: on {ex.output_devices.get(name)}, expected on {device}")
            continue
        tol = part.tolerance(name, case.dtype, device)
        mismatch = compare(name, ex.outputs[name], exp, tol)
        if mismatch:
            problems.append(mismatch.message)
    if not problems:
        return Verdict(True)
    return Verdict(False, f"{function} is wrong on\n{describe_case(case, inputs)}\n" + "\n".join(problems))


def judge_integrity(part: Part, case: Case, ex: Execution, *, student_dir: str) -> Verdict:
    """Integrity verdict: own Triton kernel launched, no PyTorch compute, inputs kept, no aliasing."""
    function = part.functions[0]
    if ex.error_kind is not None:
        return Verdict(False, f"{function} could not be checked: {ex.error}")
    flags = integrity.judge(
        integrity.Observation(ex.ops, ex.kernels),
        function=function,
        student_dir=student_dir,
        allowed_ops=part.allowed_ops,
    )
    inputs = part.make_inputs(case)
    changed = [
        name for name, before in inputs.items()
        if isinstance(before, torch.Tensor) and not tensors.same_bits(before, ex.inputs_after[name])
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
    if not flags:
        return Verdict(True)
    return Verdict(False, "\n".join(f"[{f.rule}] {f.message}" for f in flags), flags)


@dataclass
class BadInputOutcome:
    """What a bad-input call did; plain data, so the grader's worker can send it to the verdict process."""

    raised: str | None = None  # the exception's class name; None: the call returned normally
    raised_types: list[str] = field(default_factory=list)  # "module.qualname" of every class in its MRO
    message: str = ""


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def execute_bad_input(module: ModuleType, bad, device: str) -> BadInputOutcome:
    """Make the bad call; NotImplementedError propagates (the function is not written yet)."""
    fn = getattr(module, bad.function)
    args, kwargs = bad.make_args(device)
    try:
        fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:
        return BadInputOutcome(type(exc).__name__, [_qualname(c) for c in type(exc).__mro__], str(exc))
    return BadInputOutcome()


def judge_bad_input(bad, outcome: BadInputOutcome) -> Verdict:
    """The call must raise one of ``bad.raises`` with a message matching ``bad.match``."""
    import re

    expected = " or ".join(e.__name__ for e in bad.raises)
    if outcome.raised is None:
        return Verdict(False, f"{bad.function} ({bad.label}) returned normally — expected it to raise {expected}")
    if not any(_qualname(cls) in outcome.raised_types for cls in bad.raises):
        return Verdict(False, f"{bad.function} ({bad.label}) raised {outcome.raised}: {outcome.message} — "
                              f"expected {expected}")
    if bad.match and not re.search(bad.match, outcome.message, re.IGNORECASE):
        return Verdict(False, f"{bad.function} ({bad.label}) raised {outcome.raised}: {outcome.message} — "
                              f"the message should mention {bad.match!r}")
    return Verdict(True)


def check_bad_input(module: ModuleType, bad, device: str) -> Verdict:
    """The call must raise one of ``bad.raises`` with a message matching ``bad.match``."""
    return judge_bad_input(bad, execute_bad_input(module, bad, device))


def run_case(exercise: Exercise, part: Part, module: ModuleType, case: Case, device: str) -> Verdict:
    """Execute and judge in one process (the pytest path)."""
    return judge(part, case, execute(part, module, case, device), device)
