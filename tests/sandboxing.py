"""Whether this machine can sandbox student code (bubblewrap), and what the tests do about it.

Where the sandbox can be built, every grading test runs in it. Where it cannot (a laptop without bwrap),
the grading tests run with ``--unsandboxed`` and the isolation tests skip with the reason, unless
``GRADER_REQUIRE_SANDBOX=1`` (CI sets it): then nothing is run unsandboxed, and the tests fail loudly.
"""

from __future__ import annotations

import os
from functools import cache

import pytest

from grader.checks import runtime
from grader.grading.isolation import bwrap

REQUIRED = os.environ.get("GRADER_REQUIRE_SANDBOX") == "1"


@cache
def sandbox_check() -> bwrap.Check:
    return bwrap.check(runtime.configure().device)


def sandboxed() -> bool:
    """Whether the grading tests run in the sandbox (always, where it is required)."""
    return REQUIRED or sandbox_check().sandbox is not None


def sandbox_options() -> dict[str, bool]:
    """``GradeOptions`` keywords: unsandboxed only where no sandbox can be built and none is required."""
    return {"unsandboxed": not sandboxed()}


def sandbox_args() -> list[str]:
    """The same, as ``grader grade`` arguments."""
    return [] if sandboxed() else ["--unsandboxed"]


def require_sandbox() -> bwrap.Sandbox:
    """The sandbox; a skip with the reason where there is none (a failure where it is required)."""
    found = sandbox_check()
    if found.sandbox is None:
        if REQUIRED:
            pytest.fail(f"GRADER_REQUIRE_SANDBOX=1 but the sandbox cannot be built: {found.problem}")
        pytest.skip(f"no sandbox on this machine: {found.problem}")
    return found.sandbox


def live_processes_with(marker: str) -> list[int]:
    """The pids of live (not zombie) processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found
