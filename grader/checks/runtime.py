"""Where kernels run: a CUDA GPU when there is one, otherwise the Triton interpreter on the CPU.

The interpreter must be chosen *before* ``triton`` is imported: ``@triton.jit`` wraps a kernel at
decoration time, so a module imported earlier keeps its compiled-kernel wrapper. ``configure()`` is
therefore called by the pytest plugin and the grader CLI at import, before any student module loads.

``GRADER_DEVICE=cpu`` forces the interpreter even on a GPU machine (handy to reproduce what a
student without a GPU sees); ``GRADER_DEVICE=cuda`` makes a missing GPU an error instead of a
silent fallback.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from functools import cache

# The Triton the course grades with: the grading GPUs' (with torch 2.11). Its interpreter runs block pointers
# (tl.make_block_ptr, tl.advance; 3.9's interpreter removed them) and tensor descriptors alike, so a kernel that passes
# a student's tests on a CPU runs on the grading GPU. .ci/constraints.txt pins the same version (a test holds them
# equal); version_note() says so wherever another one runs.
COURSE_TRITON = "3.6.0"


class RuntimeSetupError(RuntimeError):
    """The environment cannot run the exercises as configured (told to the user verbatim)."""


@dataclass(frozen=True)
class Mode:
    device: str  # "cuda" or "cpu"
    interpreter: bool
    description: str
    gpu_name: str | None = None  # torch.cuda.get_device_name() on CUDA

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@cache
def configure() -> Mode:
    """Pick the device, set ``TRITON_INTERPRET`` if needed, and return the mode (idempotent)."""
    wanted = os.environ.get("GRADER_DEVICE", "").strip().lower()
    if wanted not in ("", "cpu", "cuda"):
        raise RuntimeSetupError(f"GRADER_DEVICE must be 'cpu' or 'cuda', not {wanted!r}")
    has_cuda = _cuda_available()
    if wanted == "cuda" and not has_cuda:
        raise RuntimeSetupError("GRADER_DEVICE=cuda but torch sees no CUDA GPU")
    interpreter = wanted == "cpu" or not has_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    if interpreter:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeSetupError(
                "triton was imported before the grader could set TRITON_INTERPRET=1; "
                "run `TRITON_INTERPRET=1 pytest ...` or import the grader first"
            )
        os.environ["TRITON_INTERPRET"] = "1"
        _check_interpreter_versions()
    import torch
    import triton

    versions = f"torch {torch.__version__}, triton {triton.__version__}"
    if interpreter:
        mode = Mode("cpu", True, f"CPU via the Triton interpreter (TRITON_INTERPRET=1); {versions}")
    else:
        name = torch.cuda.get_device_name()
        mode = Mode("cuda", False, f"CUDA on {name}; {versions}", name)
    return mode


CU_CTX_SCHED_BLOCKING_SYNC = 0x04


def sleep_while_waiting() -> bool:
    """Make this process's thread sleep, not spin, while it waits for its GPU work (a synchronization, a copy to
    the CPU): CUDA spins by default when it has a core per context, and a batch has twenty processes on one GPU
    whose cores compile the next student's kernels. Call it before the process's CUDA context exists (it sets the
    primary context's flags, through the driver). Adds microseconds to a wait; timing uses CUDA events, which it
    leaves alone. False where there is no CUDA driver or it refused."""
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    set_flags = getattr(driver, "cuDevicePrimaryCtxSetFlags_v2", None) or getattr(
        driver, "cuDevicePrimaryCtxSetFlags", None)
    count, device = ctypes.c_int(), ctypes.c_int()
    if set_flags is None or driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    done = count.value > 0
    for ordinal in range(count.value):
        done = (driver.cuDeviceGet(ctypes.byref(device), ordinal) == 0
                and set_flags(device, CU_CTX_SCHED_BLOCKING_SYNC) == 0 and done)
    return done


def start_cuda() -> str | None:
    """Create this process's CUDA context and load Triton's GPU driver (its C utilities, built by the C compiler
    the first time) now, before any request: a case that created them took 4–6 s on a loaded host, and every turn
    alone asked for meanwhile waited for that case to end. Neither runs a kernel. Why it failed, or None (the first
    case then meets the same error and reports it)."""
    try:
        import torch

        torch.cuda.init()
        torch.cuda.mem_get_info()  # needs the context: creates it, and allocates nothing of the caching allocator's
        from triton.runtime import driver

        driver.active.get_current_device()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def cuda_broken() -> str | None:
    """Why this process's CUDA context can no longer be used, or None. A kernel's illegal memory access is
    sticky: every later launch and copy fails with it, so the process must be replaced."""
    import torch

    if not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
        probe = torch.ones(1, device="cuda")
        probe.add_(1)
        if float(probe.item()) != 2.0:
            return "a probe kernel computed a wrong value"
    except Exception as exc:  # torch.AcceleratorError / RuntimeError: the context is gone
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def version_note(version: str | None = None) -> str | None:
    """Why results here may differ from the grader's, when the Triton is not the course's; None when it is.
    ``version``: a Triton version, or a mode's description that names one ("...; torch 2.13.0, triton 3.9.0", as a
    report records it); default: this process's (after :func:`configure`, so that importing triton is safe)."""
    if version is None:
        configure()
        import triton

        version = triton.__version__
    found = re.search(r"(?:^|\btriton )(\d+\.\d+[^\s,;)]*)", version)
    if found is None or found.group(1).split("+")[0] == COURSE_TRITON:  # 3.6.0+local: a build of the same release
        return None
    running = found.group(1)
    why = " (block pointers were removed in 3.9)" if _major_minor(running) >= (3, 9) else ""
    return (f"this machine runs triton {running}; the course grades with triton {COURSE_TRITON} — results may "
            f"differ{why}; `bash scripts/bootstrap.sh` installs the course's version")


def _check_interpreter_versions() -> None:
    """triton < 3.9's interpreter breaks on numpy >= 2.4 (``range(0, n, BLOCK)`` loops fail)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        triton_v = _major_minor(version("triton"))
        numpy_v = _major_minor(version("numpy"))
    except PackageNotFoundError:  # pragma: no cover - triton missing is reported by the import
        return
    if triton_v < (3, 9) and numpy_v >= (2, 4):
        raise RuntimeSetupError(
            f"the Triton {version('triton')} interpreter fails with numpy {version('numpy')} "
            "(range(0, n, BLOCK) loops); install numpy<2.4 or triton>=3.9"
        )


def _major_minor(text: str) -> tuple[int, int]:
    parts = text.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)

