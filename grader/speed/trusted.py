"""Timing a recorded plan: the student's compiled kernels replayed (:mod:`grader.speed.replay`) and timed
against the part's baselines by the timing engine (:mod:`grader.speed.timing`), where the student's Python
never runs.

:func:`time_plan` is the one way every face times a student's kernels: the grader's timer process
(:mod:`grader.speed.timer`, sandboxed, started per student), ``pytest -m speed``, ``grader bench`` and
``grader calibrate`` (these three record and replay in their own process: :func:`measure_replayed`).

The replay proves it did the work. Before and after the timed rounds the replayed call runs once on
inputs drawn from a seed of the timer's own, with its outputs and scratch filled with NaN first; the
inputs are then drawn again from that seed (whatever the kernels did to memory) and the part's speed
baseline computes the same function on them. An output that differs (a launch left out of the plan, a
kernel that behaves differently when replayed, an element never written) gives no speed credit and a
``replay-mismatch`` problem in the report.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grader.checks import tensors
from grader.checks.spec import Benchmark, Case, Part
from grader.speed import measure, plan_checks
from grader.speed import plan as plan_mod
from grader.speed import replay as replay_mod
from grader.speed.stats import StopRule

# Relative L2 error of a replayed output against the speed baseline's output on the same inputs: far above
# what two correct kernels differ by (bf16 rounding, TF32, summation order: ~1e-3), far below what a skipped
# launch or a wrong kernel gives (~1).
MISMATCH_RTOL = {torch.float32: 2e-2, torch.float64: 2e-2}
MISMATCH_RTOL_16 = 5e-2
REPLAY_MISMATCH = "replay-mismatch"


@dataclass
class Timed:
    """One benchmark timed from its plan, and what the replay's validation found (no credit where set)."""

    row: measure.BenchmarkTiming
    mismatch: str | None = None


def baseline_outputs(output: Any, names: list[str]) -> dict[str, torch.Tensor]:
    """A baseline's result as named outputs: a dict as it is, a tensor as the part's first output, a
    tuple/list as its outputs in order."""
    if isinstance(output, Mapping):
        return {str(k): v for k, v in output.items() if isinstance(v, torch.Tensor)}
    if isinstance(output, torch.Tensor):
        return {names[0]: output} if names else {}
    if isinstance(output, tuple | list):
        return {n: v for n, v in zip(names, output) if isinstance(v, torch.Tensor)}
    return {}


def compare(replayed: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> str | None:
    """Why ``replayed`` is not the function ``expected`` computed (None: it is)."""
    if not expected:
        return "the speed baseline returned no output to compare with"
    for name, want in expected.items():
        got = replayed.get(name)
        if got is None:
            return f"the replayed call has no output {name!r}"
        if tuple(got.shape) != tuple(want.shape):
            return f"output {name!r} has shape {tuple(got.shape)}, the baseline's {tuple(want.shape)}"
        g, w = got.detach().float(), want.detach().float()
        bad = ~torch.isfinite(g) & torch.isfinite(w)
        if bool(bad.any()):
            return (f"output {name!r}: {int(bad.sum())} of {g.numel()} elements are NaN/inf (or never written) "
                    "where the baseline's are finite")
        ok = torch.isfinite(w)
        err = float(torch.linalg.vector_norm((g - w)[ok])) / max(float(torch.linalg.vector_norm(w[ok])), 1e-30)
        tol = MISMATCH_RTOL.get(want.dtype, MISMATCH_RTOL_16)
        if err > tol:
            return f"output {name!r} differs from the baseline's by {err:.3g} (relative L2; allowed {tol:g})"
    return None


def validate(part: Part, bench: Benchmark, replay: replay_mod.Replay, seed: int) -> str | None:
    """Run the replay once on inputs drawn from ``seed`` and compare with the speed baseline (see the module
    docstring); the reason it failed, or None."""
    case = Case(dict(bench.case.params), seed)
    with tensors.generated_on("cuda"):
        inputs = part.make_inputs(case)
    replay.poison = True
    try:
        replayed = {k: v.clone() for k, v in replay(inputs).items()}
    finally:
        replay.poison = False
    torch.cuda.synchronize()
    del inputs
    with tensors.generated_on("cuda"):  # drawn again: nothing the kernels did to the first draw matters
        inputs = part.make_inputs(case)
    assert part.speed_baseline is not None
    expected = baseline_outputs(part.baselines[part.speed_baseline](inputs), list(replayed))
    torch.cuda.synchronize()
    return compare(replayed, expected)


@dataclass
class Prepared:
    """A benchmark's plan checked, its kernels loaded and its replay validated (:func:`prepare`), ready for
    :func:`measure_prepared` with the GPU alone, then :func:`finish`. ``replay`` None: nothing to time (``over``:
    the row is final as it is)."""

    part: Part
    bench: Benchmark
    row: measure.BenchmarkTiming
    replay: replay_mod.Replay | None = None
    mismatch: str | None = None
    plan_summary: str = ""
    over: bool = False
    own_s: float = 0.0  # loading and validating, counted in the row's warm-up (the wait for the turn is not)
    yardstick: replay_mod.Replay | None = None  # the reference solution's replay, timed in the same rounds
    yardstick_problem: str | None = None  # why a yardstick plan given could not be used (the grader's side)


def prepare(part: Part, bench: Benchmark, plan: plan_mod.LaunchPlan, *, folder: Path,
            yardstick: plan_mod.LaunchPlan | None = None) -> Prepared:
    """Check ``plan``, load its kernels and validate the replay once (sharing the GPU); the same for ``yardstick``
    (the reference solution's plan, recorded by the grader) where the student's replay is ready."""
    started = time.monotonic()
    prepared = Prepared(part, bench, measure.BenchmarkTiming(bench.label), plan_summary=plan.summary())
    try:
        _prepare(prepared, plan, folder)
        if yardstick is not None and prepared.replay is not None:
            prepared.yardstick, prepared.yardstick_problem = _yardstick(part, bench, yardstick, folder / "yardstick")
    finally:
        prepared.own_s += time.monotonic() - started
    return prepared


def _yardstick(part: Part, bench: Benchmark, plan: plan_mod.LaunchPlan, folder: Path
               ) -> tuple[replay_mod.Replay | None, str | None]:
    """The reference's replay, validated like a student's: (replay, None), or (None, why it cannot be used)."""
    try:
        replay = replay_mod.Replay(plan, folder)
        wrong = validate(part, bench, replay, random.SystemRandom().getrandbits(62))
    except Exception as exc:
        return None, f"the reference solution's kernels could not be replayed: {type(exc).__name__}: {exc}"
    if wrong:
        return None, f"the reference solution's replay did not compute the function: {wrong}"
    return replay, None


def _prepare(prepared: Prepared, plan: plan_mod.LaunchPlan, folder: Path) -> None:
    part, bench = prepared.part, prepared.bench
    sources = measure.input_sets(part, bench, 1, device="cuda")
    input_bytes = {k: v.untyped_storage().nbytes() for k, v in sources[0].items() if isinstance(v, torch.Tensor)}
    del sources
    refused = plan_checks.problems(plan, input_bytes, output_names=tuple(plan.outputs))
    if refused:
        prepared.row.error = ("not measurable: the recorded launches cannot be replayed safely: "
                              + "; ".join(refused[:3]))
        prepared.over = True
        return
    try:
        replay = replay_mod.Replay(plan, folder)
    except replay_mod.ReplayError as exc:
        prepared.row.error = f"not measurable: {exc}"
        prepared.over = True
        return
    try:
        prepared.mismatch = validate(part, bench, replay, random.SystemRandom().getrandbits(62))
    except Exception as exc:  # a launch the driver refused, a kernel that faulted: the student's kernels
        prepared.row.error = f"the replayed kernels failed: {type(exc).__name__}: {exc}"
        prepared.over = True
        return
    if prepared.mismatch is None:
        prepared.replay = replay


def measure_prepared(prepared: Prepared, *, budget_s: float, baselines: list[str] | None = None,
                     samples: list[float] | None = None,
                     extra: Mapping[str, Callable[[Any], Any]] | None = None, rule: StopRule | None = None,
                     warmup_ms: float = 25.0) -> None:
    """The timed rounds of a prepared benchmark against ``baselines`` (default: the grading baselines) and
    ``extra`` candidates, until ``rule`` says stop (default: calibration's, within ``budget_s``), after the timing
    engine's warm-up (``warmup_ms``): the caller holds the GPU alone."""
    if prepared.replay is None:
        return
    if prepared.yardstick is not None:
        extra = {measure.REFERENCE: prepared.yardstick, **(extra or {})}
    try:
        prepared.row = measure.measure_benchmark(prepared.part, prepared.replay, prepared.bench, device="cuda",
                                                 budget_s=budget_s, baselines=baselines, samples=samples,
                                                 extra=extra, rule=rule, warmup_ms=warmup_ms)
    except Exception as exc:
        prepared.row = measure.BenchmarkTiming(prepared.bench.label,
                                               error=f"the replayed kernels failed: {type(exc).__name__}: {exc}")
        prepared.replay, prepared.over = None, True


def finish(prepared: Prepared) -> Timed:
    """Validate the replay again after its timed rounds (sharing the GPU), and the benchmark's row."""
    row = prepared.row
    if prepared.over:
        return Timed(row)
    if prepared.replay is not None and not row.error:
        started = time.monotonic()
        try:
            prepared.mismatch = validate(prepared.part, prepared.bench, prepared.replay,
                                         random.SystemRandom().getrandbits(62))
        except Exception as exc:
            row.error = f"the replayed kernels failed: {type(exc).__name__}: {exc}"
            return Timed(row)
        finally:
            prepared.own_s += time.monotonic() - started
    if prepared.mismatch:
        row.error = f"the replayed kernels did not compute the function: {prepared.mismatch}"
        row.times = {}
    row.warmup_s += prepared.own_s  # the timing engine's warm-up (in the turn), then loading and validating
    row.notes.append(f"timed by replaying {prepared.plan_summary}")
    if prepared.yardstick_problem:
        row.notes.append(prepared.yardstick_problem)
    return Timed(row, prepared.mismatch)


def time_plan(part: Part, bench: Benchmark, plan: plan_mod.LaunchPlan, *, folder: Path, budget_s: float,
              baselines: list[str] | None = None, samples: list[float] | None = None,
              extra: Mapping[str, Callable[[Any], Any]] | None = None,
              alone: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> Timed:
    """Check ``plan``, replay it, validate it, and time it against ``baselines`` (default: the grading
    baselines) and ``extra`` candidates on ``bench``; the timing inside ``alone()`` (the GPU held alone)."""
    prepared = prepare(part, bench, plan, folder=folder)
    if prepared.replay is not None:
        with alone():
            measure_prepared(prepared, budget_s=budget_s, baselines=baselines, samples=samples, extra=extra)
    return finish(prepared)
