"""Recording the student's call and timing its replay in one process: ``pytest -m speed``, ``grader bench`` and
``grader calibrate``, where the student's code is the student's own business or the reference. The grader records in
its sandboxed worker (:mod:`grader.speed.student_calls`) and times in a process of its own
(:mod:`grader.speed.timer`), and neither imports this module."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from grader.checks.spec import Benchmark, Part
from grader.checks.student_errors import student_traceback
from grader.speed import trusted
from grader.speed.measure import BenchmarkTiming
from grader.speed.student_calls import record_benchmark


def measure_replayed(part: Part, module: ModuleType, bench: Benchmark, *, budget_s: float,
                     baselines: list[str] | None = None, samples: list[float] | None = None,
                     extra: Mapping[str, Callable[[Any], Any]] | None = None) -> BenchmarkTiming:
    """Record the student's call and time its replay in this process: ``pytest -m speed``, ``grader bench`` and
    ``grader calibrate`` (the grader times in a process of its own: :mod:`grader.speed.timer`)."""
    try:
        recorded, record_s = record_benchmark(part, module, bench)
    except NotImplementedError:
        return BenchmarkTiming(bench.label, error=f"{' / '.join(part.functions)} is not implemented yet",
                               not_implemented=True)
    except Exception as exc:
        return BenchmarkTiming(bench.label, error=f"{part.functions[0]} raised {student_traceback(exc)}")
    if isinstance(recorded, str):
        return BenchmarkTiming(bench.label, error=f"not measurable: {recorded}")
    with tempfile.TemporaryDirectory(prefix="grader-replay-") as folder:
        timed = trusted.time_plan(part, bench, recorded, folder=Path(folder), budget_s=budget_s, baselines=baselines,
                                  samples=samples, extra=extra)
    timed.row.warmup_s += record_s
    return timed.row
