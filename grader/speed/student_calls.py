"""The student's call, run where the student's module is imported: the worker, pytest, ``grader bench`` and
``grader calibrate``; never the trusted timer, which times only what this recorded.

:func:`record_part` runs the student's call on each benchmark's inputs (compiling and autotuning its kernels), then
once more while :mod:`grader.speed.recorder` records what the call launches, and returns those
:class:`~grader.speed.plan.LaunchPlan` s in a :class:`~grader.speed.measure.SpeedMeasurement`; it then calls the
student's code once more on inputs it was handed (the grader draws them from a secret seed), so that the result is
checked at benchmark size. :func:`warm_part` and :func:`tune_part` compile and autotune ahead of the
recording. Recording and timing in one process (``pytest -m speed``, ``grader bench``, ``grader calibrate``) is
:mod:`grader.speed.in_process`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch

from grader.checks import tensors
from grader.checks.execute import execute
from grader.checks.spec import Benchmark, Inputs, Part
from grader.checks.student_errors import student_traceback
from grader.speed import timing
from grader.speed.measure import BenchmarkTiming, SpeedMeasurement, input_sets
from grader.speed.plan import LaunchPlan


def student_call(part: Part, module: ModuleType) -> Callable[[Inputs], Any]:
    """The part's call of the student's API, as a function of the inputs."""
    return lambda inputs: part.call(module, inputs)


def record_benchmark(part: Part, module: ModuleType, bench: Benchmark, *, warmup_calls: int = 2,
                     keep: dict[str, Any] | None = None) -> tuple[LaunchPlan | str, float]:
    """Run the student's call on the benchmark's inputs ``warmup_calls`` times (compilation, autotuning), then
    once more recording it. Returns the plan, or why there is none, and the seconds it took; ``keep``, where
    given, receives copies of the recorded call's outputs. The student's exceptions propagate."""
    from grader.speed import recorder  # here: the trusted timer imports this module, never the recorder

    started = time.monotonic()
    inputs = input_sets(part, bench, 1, device="cuda")[0]
    call = student_call(part, module)
    try:
        for _ in range(warmup_calls):
            call(timing.fresh_inputs(inputs))
        torch.cuda.synchronize()
        outputs, plan = recorder.record_call(call, timing.fresh_inputs(inputs))
        if keep is not None and isinstance(outputs, dict):
            keep.update({k: v.detach().clone() for k, v in outputs.items() if isinstance(v, torch.Tensor)})
    except recorder.NotReplayable as exc:
        return str(exc), time.monotonic() - started
    finally:
        del inputs
        torch.cuda.empty_cache()
    return plan, time.monotonic() - started


def same_outputs(outputs: Mapping[str, torch.Tensor] | None, earlier: Mapping[str, Any]) -> bool:
    """Whether ``outputs`` are bit for bit ``earlier``: the same names, shapes, dtypes and bytes."""
    if not outputs or set(outputs) != set(earlier):
        return False
    return all(out.shape == earlier[name].shape and out.dtype == earlier[name].dtype
               and tensors.row_major_bytes(out) == tensors.row_major_bytes(earlier[name])
               for name, out in outputs.items())


def warm_part(part: Part, module: ModuleType) -> str | None:
    """Call the student's code once on each benchmark's inputs (CUDA only): its kernels for those shapes are
    compiled before :func:`record_part` runs, while the GPU is still shared. The first error, or None; the
    speed measurement meets it again and reports it."""
    call = student_call(part, module)
    for bench in part.benchmarks:
        inputs = input_sets(part, bench, 1, device="cuda")[0]
        try:
            call(timing.fresh_inputs(inputs))
            torch.cuda.synchronize()
        except Exception as exc:
            return f"{part.functions[0]} raised {type(exc).__name__}"
        finally:
            del inputs
            torch.cuda.empty_cache()
    return None


def tune_part(part: Part, module: ModuleType) -> None:
    """Call the student's code once on each benchmark's inputs (CUDA only), so that the student's autotuners make
    every choice of the part here, in one stretch, before :func:`record_part`: the caller holds the GPU alone from
    the first candidate timed (:func:`grader.speed.autotune.one_turn`), and the recording needs it no longer. The
    inputs are all built first, before any candidate is timed. Stops at the first error: the recording meets it
    again and reports it."""
    call = student_call(part, module)
    sets = [input_sets(part, bench, 1, device="cuda")[0] for bench in part.benchmarks]
    try:
        for inputs in sets:
            call(timing.fresh_inputs(inputs))
            torch.cuda.synchronize()
    except Exception:
        return
    finally:
        del sets
        torch.cuda.empty_cache()


def record_part(part: Part, module: ModuleType, *, recheck_inputs: Inputs | None) -> SpeedMeasurement:
    """Record every benchmark of ``part`` (CUDA only), then call the student's code on ``recheck_inputs`` (the first
    benchmark's shapes: only where that benchmark was recorded). A benchmark whose call raises (an option left
    unwritten, say) costs its own credit: the others are recorded and timed."""
    measurement = SpeedMeasurement(torch.cuda.get_device_name())
    first_outputs: dict[str, Any] = {}  # the first benchmark's: the recheck has its shapes, other values
    for bench in part.benchmarks:
        row = BenchmarkTiming(bench.label)
        measurement.benchmarks.append(row)
        try:
            recorded, row.warmup_s = record_benchmark(part, module, bench,
                                                      keep=None if measurement.plans else first_outputs)
        except NotImplementedError as exc:
            row.error = f"{' / '.join(part.functions)} is not implemented yet" + (f" ({exc})" if str(exc) else "")
            row.not_implemented = True
            continue
        except Exception as exc:
            row.error = f"{part.functions[0]} raised {student_traceback(exc)}"
            continue
        measurement.plans[bench.label] = recorded
    if recheck_inputs is not None and first_outputs:
        measurement.recheck = execute(part, module, recheck_inputs, "cuda")
        measurement.recheck_repeats = same_outputs(measurement.recheck.outputs, first_outputs)
    return measurement
