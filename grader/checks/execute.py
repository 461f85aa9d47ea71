"""Run the student's code on one check and record what happened: the half of every check that runs in
the process that imported the student's module (pytest's, or the grader's sandboxed worker).

Nothing here judges. :func:`execute` calls a part's API on given inputs under the integrity monitor and
returns an :class:`Execution` (outputs copied to the CPU, ops, kernel launches, inputs after the call,
aliasing); :func:`execute_bad_input` makes a call that must raise and records how it raised. The
verdicts are computed from these records by :mod:`grader.checks.verdicts`, which never touches student
code, so the grader can put a process boundary in between.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from grader.checks import integrity, interpreter_limits, tensors
from grader.checks.scratch import scratch_note
from grader.checks.spec import BadInput, Inputs, Part

ERROR_KINDS = ("not_implemented", "exception", "bad_output")


@dataclass
class Execution:
    """What one call of the student's code produced; plain data (picklable, torch.save-able)."""

    outputs: dict[str, torch.Tensor] | None = None  # CPU copies
    output_devices: dict[str, str] = field(default_factory=dict)
    error_kind: str | None = None  # one of ERROR_KINDS
    error: str | None = None
    ops: list[str] = field(default_factory=list)
    kernels: list[tuple[str, str]] = field(default_factory=list)
    inputs_after: dict[str, torch.Tensor] = field(default_factory=dict)  # CPU copies of tensor inputs
    aliased: list[str] = field(default_factory=list)  # "output <- input" pairs sharing memory


@dataclass
class BadInputOutcome:
    """What a bad-input call did."""

    raised: str | None = None  # the exception's class name; None: the call returned normally
    raised_types: list[str] = field(default_factory=list)  # "module.qualname" of every class in its MRO
    message: str = ""


def device_inputs(inputs: Inputs, device: str) -> Inputs:
    """Fresh copies of the tensor inputs on ``device``, with their strides and storage offsets."""
    return {k: tensors.to_device(v, device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def execute(part: Part, module: ModuleType, inputs: Inputs, device: str) -> Execution:
    """Call the student's code on copies of ``inputs`` and record everything the verdicts need."""
    dev_inputs = device_inputs(inputs, device)
    ex = Execution()
    try:
        with integrity.monitor() as obs:  # also marks the call's fresh memory as never written
            try:
                outputs = part.call(module, dev_inputs)
            finally:
                if device == "cuda":
                    torch.cuda.synchronize()
    except Exception as exc:  # the student's exception is the result we report
        if isinstance(exc, NotImplementedError) and not interpreter_limits.raised_inside_triton(exc):
            ex.error_kind, ex.error = "not_implemented", str(exc)  # the student's unwritten stub, not triton's
        else:
            ex.error_kind, ex.error = "exception", student_traceback(exc)
        return ex
    ex.ops, ex.kernels = list(obs.ops), list(obs.kernels)
    if not isinstance(outputs, dict) or not all(isinstance(v, torch.Tensor) for v in outputs.values()):
        ex.error_kind, ex.error = "bad_output", f"expected tensors, got {type_summary(outputs)}"
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


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def execute_bad_input(module: ModuleType, bad: BadInput, device: str) -> BadInputOutcome:
    """Make the bad call; the student's NotImplementedError propagates (the function is not written yet)."""
    fn = getattr(module, bad.function)
    args, kwargs = bad.make_args(device)
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        if isinstance(exc, NotImplementedError) and not interpreter_limits.raised_inside_triton(exc):
            raise
        return BadInputOutcome(type(exc).__name__, [qualname(c) for c in type(exc).__mro__], str(exc))
    return BadInputOutcome()


_INTERNAL = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # the grader package
    f"{os.sep}triton{os.sep}",
    f"{os.sep}torch{os.sep}",
)


def student_frames(exc: BaseException) -> str:
    """The last few frames of the student's own code (not the grader's, triton's or torch's)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not any(p in f.filename for p in _INTERNAL)]
    return "".join(traceback.format_list(frames[-3:])).rstrip()


def student_traceback(exc: BaseException) -> str:
    """The exception and the student's frames where it was raised, and the note when a known limit of the Triton
    interpreter (or of the installed Triton) explains it: such an error reads like the student's bug."""
    where = student_frames(exc)
    note = interpreter_limits.note(exc) or scratch_note(exc)
    return f"{type(exc).__name__}: {exc}" + (f"\n{where}" if where else "") + (f"\n{note}" if note else "")


def type_summary(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {type(v).__name__}" for k, v in value.items()) + "}"
    return type(value).__name__
