"""What one call of the student's code produced, as plain data (picklable, ``torch.save``-able): written where the
student's module is imported (:mod:`grader.checks.execute`), judged where it is not (:mod:`grader.checks.verdicts`),
and sent between the two (:mod:`grader.grading.isolation.wire`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

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
