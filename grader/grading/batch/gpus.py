"""The GPUs of this host: which ones a batch uses (``--gpus all`` / ``--gpus 0,2,3`` / the current one),
how a worker is pinned to one, and whether one is still healthy after a run went wrong.

A failing *student* kernel ("device-side assert", "an illegal memory access", "unspecified launch
failure") leaves the GPU usable: a fresh process still sees it and can run on it. A failing *GPU* (fell
off the bus, Xid, lost) does not: :func:`probe` asks a fresh process, pinned to that GPU alone, whether
CUDA still sees exactly that device and can run on it. Only the probe decides: nothing a student prints
can take a GPU out of the pool.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from grader.grading.exercise_run.slots import GIB_PER_RUN, Slot
from grader.grading.isolation import threads

PROBE_TIMEOUT_S = 60.0

_PROBE = """
import sys, torch
if not torch.cuda.is_available():
    sys.exit("CUDA is not available (torch.cuda.is_available() is False)")
if torch.cuda.device_count() != 1:
    sys.exit(f"{torch.cuda.device_count()} devices visible instead of 1")
uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))
if sys.argv[1] and uuid != sys.argv[1]:
    sys.exit(f"a different device answers (uuid {uuid})")
x = torch.ones(1 << 20, device="cuda")
assert float(x.sum()) == float(1 << 20)
torch.cuda.synchronize()
"""


@dataclass(frozen=True)
class Gpu:
    index: int  # as this process numbers them
    name: str
    uuid: str
    pin: str  # the worker's CUDA_VISIBLE_DEVICES
    memory_bytes: int = 0

    def device_info(self) -> dict:
        return {"kind": "cuda", "name": self.name, "index": self.index, "uuid": self.uuid}


def visible() -> list[Gpu]:
    """The GPUs torch sees here, each with the CUDA_VISIBLE_DEVICES entry that shows a worker that GPU
    alone (a restricted CUDA_VISIBLE_DEVICES of our own, e.g. from Slurm, is honoured)."""
    import torch

    parent = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        pin = parent[i] if i < len(parent) else str(i)
        gpus.append(Gpu(i, props.name, str(getattr(props, "uuid", "")), pin, int(getattr(props, "total_memory", 0))))
    return gpus


def current_index() -> int:
    import torch

    return torch.cuda.current_device()


class GpuSelectionError(ValueError):
    pass


def select(spec: str | None, available: Sequence[Gpu], current: int) -> list[Gpu]:
    """``None``: the current GPU; ``"all"``; or a comma-separated list of indices (``"0,2,3"``)."""
    by_index = {g.index: g for g in available}
    if not available:
        raise GpuSelectionError("no GPU is visible here")
    if spec is None or not spec.strip():
        return [by_index.get(current, available[0])]
    if spec.strip().lower() == "all":
        return list(available)
    chosen = []
    for token in spec.split(","):
        token = token.strip()
        if not token:
            continue
        if not token.isdigit() or int(token) not in by_index:
            raise GpuSelectionError(f"--gpus {spec}: no GPU {token!r} here (visible: "
                                    f"{', '.join(str(g.index) for g in available)}, or 'all')")
        if by_index[int(token)] not in chosen:
            chosen.append(by_index[int(token)])
    if not chosen:
        raise GpuSelectionError(f"--gpus {spec!r} names no GPU")
    return chosen


def probe(pin: str, uuid: str = "", *, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None if a fresh process pinned to ``pin`` still sees that one GPU and runs on it; else why not."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": pin}
    env.pop("TRITON_INTERPRET", None)
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, uuid], env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"the GPU did not answer a health check within {timeout_s:g} s"
    if done.returncode != 0:
        lines = [line for line in (done.stderr or "").strip().splitlines() if line.strip()]
        return f"health check failed: {lines[-1] if lines else f'exit code {done.returncode}'}"
    return None


MAX_JOBS_PER_GPU = 8
CORES_PER_JOB = 2  # a run compiles kernels on one core while the grader judges its replies on another


def auto_jobs(gpu: Gpu, *, gpus: int, cores: int | None = None) -> int:
    """Exercise runs to share ``gpu`` when ``--jobs`` is not given: what its memory and this host's cores (shared
    by ``gpus`` GPUs) allow, at most :data:`MAX_JOBS_PER_GPU`. Only timed work holds the GPU alone, so the rest of
    the runs' work (compilation, correctness, judging) overlaps."""
    cores = cores if cores is not None else threads.available_cores()
    by_cores = cores // (CORES_PER_JOB * max(1, gpus))
    by_memory = gpu.memory_bytes // (GIB_PER_RUN << 30) if gpu.memory_bytes else MAX_JOBS_PER_GPU
    return int(max(1, min(MAX_JOBS_PER_GPU, by_cores, by_memory)))


def gpu_slots(spec: str | None, capacity: int, *, available: Sequence[Gpu], current: int) -> list[Slot]:
    """One slot per chosen GPU, its workers pinned to it with CUDA_VISIBLE_DEVICES; ``capacity`` runs share each
    (0: :func:`auto_jobs`)."""
    chosen = select(spec, available, current)
    return [Slot(f"cuda:{g.index}", g.device_info(), {"CUDA_VISIBLE_DEVICES": g.pin}, gpu_name=g.name,
                 capacity=capacity if capacity > 0 else auto_jobs(g, gpus=len(chosen))) for g in chosen]


def cpu_slots(jobs: int) -> list[Slot]:
    return [Slot(f"cpu-{i}", {"kind": "cpu"}) for i in range(max(1, jobs))]


def probe_slot(slot: Slot) -> str | None:
    return probe(slot.env.get("CUDA_VISIBLE_DEVICES", ""), str(slot.device.get("uuid", "")))
