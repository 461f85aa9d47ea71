"""CPU threads of a batch's processes.

PyTorch's CPU thread pool (OpenMP) defaults to one thread per core, in every process, and each thread that calls a
parallel operation gets a pool of its own. A batch runs dozens of processes at once (each exercise run's workers
and trusted timer) while the grader's process judges every run's replies, each on a thread of its own: left at the
default, a host of C cores runs about C threads per process and per judging thread, which spin after each parallel
operation against each other. On a 4-GPU host of 64 cores the same batch cost 2.3 times the host CPU it cost on one
GPU of a 16-core host; with this cap, its first 40 runs took about 216 s instead of 296 s (docs/performance.md).

* Workers and trusted timers get one thread: they drive a GPU, or the interpreter's small blocks, and the host's
  cores are shared between many of them.
* The grader's process gets the cores shared between the exercise runs it judges at once.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

# the variables that size the CPU thread pools of torch (OpenMP, MKL) and of numpy (OpenBLAS) in a child process
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CHILD_THREADS = 1


def child_env() -> dict[str, str]:
    """The environment that gives a worker or a trusted timer :data:`CHILD_THREADS` CPU threads."""
    return {name: str(CHILD_THREADS) for name in THREAD_VARIABLES}


CORES_VARIABLE = "GRADER_CORES"  # a grader process's share of the host's cores, where several share the host


def available_cores() -> int:
    """The cores this process may use: its affinity, or its share of them (:data:`CORES_VARIABLE`) where a batch is
    split over several grader processes."""
    cores = len(os.sched_getaffinity(0))
    share = os.environ.get(CORES_VARIABLE, "")
    return max(1, min(cores, int(share))) if share.isdigit() else cores


def grader_threads(runs: int, cores: int | None = None) -> int:
    """CPU threads for each of the grader's judging threads, with ``runs`` exercise runs judged at once."""
    cores = available_cores() if cores is None else cores
    return max(1, cores // max(1, runs))


_LOCK = threading.Lock()
_ACTIVE = [0, 0]  # batches in this process setting the grader's threads now; the setting before the first


@contextlib.contextmanager
def judging(runs: int) -> Iterator[int]:
    """The grader's CPU threads set for ``runs`` exercise runs at once while the block runs (threads started in it
    use that many); set back when the last such block of this process ends (``grader serve`` runs several)."""
    import torch  # here, not above: a child's environment is built without importing torch

    count = grader_threads(runs)
    with _LOCK:
        if _ACTIVE[0] == 0:
            _ACTIVE[1] = torch.get_num_threads()
        _ACTIVE[0] += 1
        torch.set_num_threads(count)
    try:
        yield count
    finally:
        with _LOCK:
            _ACTIVE[0] -= 1
            if _ACTIVE[0] == 0:
                torch.set_num_threads(_ACTIVE[1])
