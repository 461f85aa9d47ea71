"""What a student is told of an exception their code raised, or of a value it returned: their own frames (not the
grader's, Triton's or torch's), and the note when a known limit of the Triton interpreter or of the scratch space
explains it."""

from __future__ import annotations

import os
import traceback
from typing import Any

from grader.checks import interpreter_limits
from grader.checks.scratch import scratch_note

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
