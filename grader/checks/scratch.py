"""What a student is told when their code fills the sandbox's scratch space (``/tmp``, a sized tmpfs where the
sandbox can make one: :mod:`grader.grading.isolation.bwrap`). The worker learns the bound from its environment."""

from __future__ import annotations

import errno
import os

SCRATCH_VAR = "GRADER_SCRATCH_BYTES"  # the sandbox's scratch bound in bytes, set by the sandbox for its worker
GiB = 1 << 30


def scratch_note(exc: BaseException, bound: str | None = None) -> str | None:
    """The note when ``exc`` (or what it was raised from) is the scratch running out (ENOSPC), else None. ``bound``:
    the scratch's size in bytes (default: ``$GRADER_SCRATCH_BYTES``)."""
    bound = os.environ.get(SCRATCH_VAR) if bound is None else bound
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:  # raised while handling it: still the full scratch
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            size = f" ({int(bound) / GiB:g} GiB)" if bound and bound.isdigit() else ""
            return f"the sandbox's scratch space{size} is full: write less to /tmp (or TMPDIR, HOME)"
        current = current.__cause__ or current.__context__
    return None
