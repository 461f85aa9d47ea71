"""Run the student's code on one check and record what happened: the half of every check that runs in
the process that imported the student's module (pytest's, or the grader's sandboxed worker).

Nothing here judges. :func:`execute` calls a part's API on given inputs under the integrity monitor and
returns an :class:`Execution` (outputs copied to the CPU, ops, kernel launches, inputs after the call,
aliasing; :mod:`grader.checks.call_records`); :func:`execute_bad_input` makes a call that must raise and records
how it raised. The verdicts are computed from these records by :mod:`grader.checks.verdicts`, which never touches
student code, so the grader can put a process boundary in between; a process that never runs student code (the
trusted timer) never imports this module.
"""

from __future__ import annotations

from types import ModuleType

import torch

from grader.checks import integrity, interpreter_limits
from grader.checks.call_records import BadInputOutcome, Execution
from grader.checks.spec import BadInput, Inputs, Part
from grader.checks.student_errors import student_traceback, type_summary
from grader.checks.tensors import device_inputs


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
