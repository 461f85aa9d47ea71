"""The grader's float64 references, computed on the GPU of the exercise run's slot.

A reference is the grader's own code run on inputs the grader built: no student code runs in this process, so the
GPU serves it as well as the CPU. On the host's cores the grader's own process took a third of a submission's CPU
time, most of it these references (FlashAttention's attention matrices, the speed rechecks at benchmark size), on
cores the workers need to compile the student's kernels; on the GPU about 100 s of it per submission are gone
(docs/performance.md, "Grading time"). The grader's process is then one more user of the slot's GPU,
through the slot's arbiter like a worker (:meth:`GpuArbiter.connect_here`): it shares the GPU with the runs on it
and pauses, as they do, while a trusted timer or an autotuner has it alone.

Its memory is capped (enforced by PyTorch's allocator, for the time of each reference only: the cap is the process's,
and whatever else the process runs on that GPU afterwards gets the whole of it back) at :data:`MEMORY_CAP_BYTES`, or
at what the GPU has beside
the runs it holds (:data:`~grader.grading.exercise_run.slots.GIB_PER_RUN` each) and the grader's own CUDA context,
whichever is less: it never takes what the runs were given, and where they leave too little it computes nothing
there. A reference that does not fit is computed on the CPU; so is every later one once the grader's own CUDA
context has failed. Either is said on stderr and costs time, never a grade: the CPU computes the same float64
reference.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

import torch

from grader.checks.gpu_gate import Gate
from grader.checks.spec import Inputs, Part
from grader.grading.exercise_run.slots import GIB_PER_RUN, Slot
from grader.grading.isolation.gpu_arbiter import GpuArbiter

MEMORY_CAP_BYTES = 4 << 30  # an 80 GB GPU holds 7 runs of 10 GiB, and this
CONTEXT_BYTES = 1 << 30  # the grader's own CUDA context, outside the allocator's cap
MIN_CAP_BYTES = 1 << 30  # less room than this: the references stay on the CPU


class GpuReferences:
    """Computes references on GPU ``index`` (as this process numbers them), sharing it through ``arbiter`` with
    ``runs`` exercise runs."""

    def __init__(self, index: int, arbiter: GpuArbiter, *, runs: int = 1):
        self.device = torch.device("cuda", index)
        self._arbiter, self._runs = arbiter, runs
        self.cap_bytes = 0  # the grader's share of the GPU's memory, once connected
        self._gate: Gate | None = None
        self._lock = threading.Lock()  # one reference on the GPU at a time: the memory cap holds for the largest
        self.on_gpu = self.on_cpu = 0  # for grader grade --profile
        self.broken: str | None = None  # why the GPU is no longer used
        self._said_too_big: set[str] = set()

    def compute(self, part: Part, inputs: Inputs) -> dict[str, Any]:
        """``part.reference(inputs)``: on the GPU, else (it did not fit, or the GPU failed) on the CPU."""
        failure: Exception | None = None
        with self._lock:
            if self.broken is None:
                try:
                    expected = self._on_gpu(part, inputs)
                except torch.cuda.OutOfMemoryError:
                    if part.name not in self._said_too_big:
                        self._said_too_big.add(part.name)
                        print(f"grader: a {part.name} reference does not fit in the grader's "
                              f"{self.cap_bytes / 2**30:.1f} GiB on {self.device}: computed on the CPU",
                              file=sys.stderr)
                except NoRoom as exc:
                    self.broken = str(exc)
                    print(f"grader: float64 references stay on the CPU: on {self.device}, {exc}", file=sys.stderr)
                except Exception as exc:  # the GPU's fault, or the reference's own: the CPU tells which
                    failure = exc
                else:
                    self.on_gpu += 1
                    return expected
            self.on_cpu += 1
        expected = part.reference(inputs)  # outside the lock: CPU references of several runs go side by side
        if failure is not None and self.broken is None:  # the CPU computed it: the grader's CUDA context failed
            self.broken = f"{type(failure).__name__}: {failure}"
            print(f"grader: float64 references on {self.device} failed ({self.broken}): computing them on the CPU "
                  "from now on", file=sys.stderr)
        return expected

    def _on_gpu(self, part: Part, inputs: Inputs) -> dict[str, Any]:
        gate = self._connect()
        total = torch.cuda.get_device_properties(self.device).total_memory
        with gate.use(), torch.cuda.device(self.device):
            torch.cuda.set_per_process_memory_fraction(self.cap_bytes / total, self.device)
            try:
                moved = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
                expected = part.reference(moved)
                # .cpu() waits for the GPU: nothing of the grader's runs there once use() ends
                return {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in expected.items()}
            finally:
                torch.cuda.set_per_process_memory_fraction(1.0, self.device)

    def _connect(self) -> Gate:
        if self._gate is None:
            total = torch.cuda.get_device_properties(self.device).total_memory
            self.cap_bytes = share(total, self._runs)
            if self.cap_bytes < MIN_CAP_BYTES:
                raise NoRoom(f"{total / 2**30:.0f} GiB hold {self._runs} run(s) of {GIB_PER_RUN} GiB and leave "
                             "the grader too little")
            self._gate = self._arbiter.connect_here("the grader's references",
                                                    synchronize=lambda: torch.cuda.synchronize(self.device))
        return self._gate


class NoRoom(RuntimeError):
    """The runs on the GPU leave the grader's references too little of its memory."""


def share(total_bytes: int, runs: int) -> int:
    """The grader's share of a GPU of ``total_bytes`` that ``runs`` exercise runs use."""
    return max(0, min(MEMORY_CAP_BYTES, total_bytes - runs * (GIB_PER_RUN << 30) - CONTEXT_BYTES))


_BY_ARBITER: weakref.WeakKeyDictionary[GpuArbiter, GpuReferences] = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


def for_slot(slot: Slot | None) -> GpuReferences | None:
    """The slot's GPU references (one per GPU, shared by the runs on it); None off the GPU."""
    if slot is None or not slot.is_gpu or slot.arbiter is None or slot.device.get("index") is None:
        return None
    with _REGISTRY_LOCK:
        found = _BY_ARBITER.get(slot.arbiter)
        if found is None:
            found = _BY_ARBITER[slot.arbiter] = GpuReferences(int(slot.device["index"]), slot.arbiter,
                                                              runs=slot.capacity)
        return found


def of(arbiter: GpuArbiter) -> GpuReferences | None:
    """What the GPU of ``arbiter`` computed (--profile), if it computed any."""
    with _REGISTRY_LOCK:
        return _BY_ARBITER.get(arbiter)
