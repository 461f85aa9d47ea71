"""Where an exercise run happens: a :class:`Slot` is one CPU worker place or one GPU, with the environment
that pins a worker to it and, for a GPU, the :class:`~grader.grading.isolation.gpu_arbiter.GpuArbiter` its
processes share it through (several exercise runs at once; a timed measurement or an autotuner has it alone).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grader.grading.isolation.gpu_arbiter import GpuArbiter

GIB_PER_RUN = 10  # GPU memory an exercise run is counted to need: its workers' CUDA contexts, benchmark inputs, caches


@dataclass
class Slot:
    """One place to run exercises: ``cpu-0`` or ``cuda:2``. ``capacity`` exercise runs may use it at once
    (their timed items still have it alone, through ``arbiter``)."""

    name: str
    device: Mapping[str, Any]  # recorded in every result: {"kind", "name", "index", "uuid"}
    env: Mapping[str, str] = field(default_factory=dict)  # the worker's pinning (CUDA_VISIBLE_DEVICES)
    gpu_name: str | None = None
    capacity: int = 1
    arbiter: GpuArbiter | None = None  # a GPU's (made with the slot)
    failed: str | None = None  # why it was taken out of the pool

    def __post_init__(self) -> None:
        if self.is_gpu and self.arbiter is None:
            self.arbiter = GpuArbiter()

    @property
    def is_gpu(self) -> bool:
        return self.device.get("kind") == "cuda"

    def describe(self) -> str:
        if not self.is_gpu:
            return self.name
        uuid = self.device.get("uuid")
        return f"{self.name} ({self.device.get('name', '?')}{', ' + str(uuid) if uuid else ''})"
