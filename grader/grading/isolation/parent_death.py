"""A child process of the grader's own (a grading run of the server, a split batch's share) that gets a signal when
the process that started it dies, so that none outlives a grader that was killed.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # prctl: the signal this process gets when its parent dies


def die_with_parent(signum: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child get ``signum`` when the process that started it dies (None off Linux).
    It runs in the child between fork and exec: nothing there but the one call."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, before the fork
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # it died between the fork and the prctl
            os.kill(os.getpid(), signum)

    return arm
