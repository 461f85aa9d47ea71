"""The trusted timer process: ``python -m grader.speed.timer JOBS.json RESULT.json [--gate R,W]``.

The grader starts one per student's exercise, in a sandbox that shows it the grader package and a scratch
folder only, never the submission: it could not import the student's module if it tried, and it imports
nothing that does (a test holds it so). It reads a :class:`TimerJob` per speed-graded part (the part, the
timing budget and the :class:`~grader.speed.plan.LaunchPlan` the student's worker recorded for each
benchmark) and times every plan in a CUDA context of its own: it first loads and validates every job's replays
(:func:`prepare`), then, once told to go (:data:`GO`, where the job file asks it to wait: the student's last
processes may still be running while it prepares, never while it times), times them (:func:`time_prepared`) and
writes a :class:`TimerResult` per job as it finishes (``RESULT.json`` for the first, ``RESULT-1.json``, ... for
the others). It holds no secret and nothing of another student: whatever a replayed kernel does to its GPU memory
ends with the process.

With ``--gate``, the two pipes to the GPU's arbiter (:mod:`grader.checks.gpu_gate`): the timer has the GPU alone
for the timed rounds of a part's benchmarks, all in one turn (each turn pauses every other process on the GPU,
which costs them the wait for their GPU work in flight); its start-up, loading the kernels and the validation
replays share the GPU with other students' work.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.speed.plan import LaunchPlan, PlanError

PROGRESS = "progress.txt"  # beside the result: "<job> <label>" before each step that runs a benchmark's kernels
GO = "go"  # beside the job file: the timed rounds may start (every process of the student's has ended)
PREPARED = "prepared"  # beside the job file, from the timer: every job is prepared, and it waits for GO
CPU = "cpu.txt"  # beside the result, as the timer ends: the CPU seconds it and the children it waited for used
# The timing engine's warm-up per candidate in the turn alone, beyond each input set's first call and the three calls
# that estimate its time (calibration's is 25 ms). The turn follows other processes' GPU work, so the GPU's clocks
# are up already, and every millisecond of it is one every other process on the GPU waits: with 25 ms the timers held
# the GPU alone 52-54 s per batch of 10, with 5 ms 37 s, every reference still with full speed credit
# (docs/decisions/0001-grading-timing-rule.md).
WARMUP_MS = 5.0


@dataclass
class TimerJob:
    exercise: str
    part: str
    budget_s: float
    plans: dict[str, LaunchPlan]  # benchmark label -> plan; benchmarks without one are not timed
    baselines: list[str] | None = None  # default: the grading baselines
    # The reference solution's plans (label -> plan), recorded by the grader: timed in the same rounds as the
    # student's, and the rounds stop on the interval of their ratio against ``boundaries`` (reference / student).
    yardstick: dict[str, LaunchPlan] = field(default_factory=dict)
    boundaries: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"exercise": self.exercise, "part": self.part, "budget_s": self.budget_s,
                "plans": {label: plan.to_dict() for label, plan in self.plans.items()}, "baselines": self.baselines,
                "yardstick": {label: plan.to_dict() for label, plan in self.yardstick.items()},
                "boundaries": list(self.boundaries)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimerJob:
        return cls(str(data["exercise"]), str(data["part"]), float(data["budget_s"]),
                   {str(k): LaunchPlan.from_dict(v) for k, v in data["plans"].items()}, data.get("baselines"),
                   {str(k): LaunchPlan.from_dict(v) for k, v in data.get("yardstick", {}).items()},
                   [float(b) for b in data.get("boundaries", [])])


@dataclass
class TimerResult:
    gpu: str
    benchmarks: list[dict[str, Any]] = field(default_factory=list)  # BenchmarkTiming.to_dict() per plan
    mismatches: list[str] = field(default_factory=list)  # "<label>: why the replay is not the function"
    error: str | None = None  # the timer itself failed (a grader fault)
    gpu_state: list[dict[str, Any]] = field(default_factory=list)  # gpu_state.GpuState before and after the rounds

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "benchmarks": self.benchmarks, "mismatches": self.mismatches, "error": self.error,
                "gpu_state": self.gpu_state}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimerResult:
        return cls(str(data["gpu"]), list(data["benchmarks"]), [str(m) for m in data["mismatches"]],
                   data.get("error"), [dict(d) for d in data.get("gpu_state", []) if isinstance(d, dict)])


def job_result(first: Path, index: int) -> Path:
    """Where job ``index``'s result goes, given the first job's."""
    return first if index == 0 else first.with_name(f"{first.stem}-{index}{first.suffix}")


@dataclass
class PreparedJob:
    """A job's replays loaded and validated (:func:`prepare`), waiting for their timed rounds."""

    job: TimerJob
    result: TimerResult
    entries: list[Any]  # trusted.Prepared, in the part's benchmark order
    per_benchmark_s: float


def prepare(job: TimerJob, folder: Path, *, index: int = 0) -> PreparedJob:
    """Load and validate every plan of ``job``, sharing the GPU (one benchmark per ``use()`` stretch: a pause for
    another process's turn waits for one benchmark's loading and validation at most, not the whole part's); the
    first that is refused, fails or is wrong ends the job's benchmarks. Each step that runs the student's kernels
    is announced in ``folder/PROGRESS`` first (see :func:`run`)."""
    import torch

    from grader import exercises
    from grader.checks import gpu_gate
    from grader.speed import trusted

    part = exercises.get(job.exercise).part(job.part)
    planned = [b for b in part.benchmarks if b.label in job.plans]
    done = PreparedJob(job, TimerResult(torch.cuda.get_device_name()), [], job.budget_s / max(1, len(planned)))
    gate = gpu_gate.current()
    for i, bench in enumerate(planned):
        _started(folder, index, bench.label)
        with gate.use():
            entry = trusted.prepare(part, bench, job.plans[bench.label], folder=folder / "replay" / f"j{index}b{i}",
                                    yardstick=job.yardstick.get(bench.label))
        done.entries.append(entry)
        if entry.replay is None:  # refused, failed or wrong: the benchmarks after it are not timed
            break
    return done


def time_prepared(prepared: PreparedJob, folder: Path, *, index: int = 0) -> TimerResult:
    """The timed rounds of every validated replay of ``prepared`` in one turn alone (each turn costs the other
    processes on the GPU a pause), under grading's rule (:meth:`StopRule.grading`), then each replay validated
    again, sharing the GPU."""
    from grader.checks import gpu_gate
    from grader.speed import gpu_state, trusted
    from grader.speed.measure import REFERENCE, STUDENT
    from grader.speed.stats import StopRule

    gate, result = gpu_gate.current(), prepared.result
    ready = [entry for entry in prepared.entries if entry.replay is not None]
    if ready:
        with gate.alone():
            result.gpu_state.append(_state(gpu_state.sample()))
            for entry in ready:
                _started(folder, index, entry.bench.label)
                budget = prepared.per_benchmark_s
                rule = (StopRule.beside(budget, (REFERENCE, STUDENT), prepared.job.boundaries)
                        if entry.yardstick is not None else StopRule.grading(budget))
                trusted.measure_prepared(entry, budget_s=budget, baselines=prepared.job.baselines, rule=rule,
                                         warmup_ms=WARMUP_MS)
                if entry.row.error:  # its row ends the part's rows (below)
                    break
            result.gpu_state.append(_state(gpu_state.sample()))
    for entry in prepared.entries:
        _started(folder, index, entry.bench.label)
        with gate.use():
            timed = trusted.finish(entry)
        result.benchmarks.append(timed.row.to_dict())
        if timed.mismatch:
            result.mismatches.append(f"{entry.bench.label}: {timed.mismatch}")
        if timed.row.error:
            break
    return result


def run(job: TimerJob, folder: Path, *, index: int = 0) -> TimerResult:
    """Time every plan of ``job`` (see the module docstring), working in ``folder``: every replay loaded and
    validated, then the timed rounds of all of them in one turn alone, then each validated again. ``"<index>
    <label>"`` is appended to ``folder/PROGRESS`` before each step that runs a benchmark's kernels, so that whoever
    started the timer knows which benchmark a crash or a hang belongs to."""
    return time_prepared(prepare(job, folder, index=index), folder, index=index)


def _state(state: Any) -> dict[str, Any]:
    """A GPU state sample as the result carries it (empty where the GPU's state cannot be read)."""
    return state.to_dict() if state is not None else {}


def _started(folder: Path, index: int, label: str) -> None:
    """Say which benchmark runs student kernels from now (a crash or a hang is charged to it)."""
    with open(folder / PROGRESS, "a") as progress:
        progress.write(f"{index} {label.replace(' ', '_')}\n")


def _write(path: Path, result: TimerResult) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict()))
    tmp.replace(path)


JOB_WAIT_S = 6 * 3600.0  # a timer never handed its jobs (its grader gone) ends by itself after this


def _get_ready(gate) -> None:
    """What every timing needs first: torch, triton and the replay code imported, this process's CUDA context."""
    import torch

    import grader.speed.trusted  # noqa: F401 - imported now, not on the clock of the exercise
    from grader import exercises

    exercises.all_exercises()
    if torch.cuda.is_available():
        with gate.use():
            torch.empty(1, device="cuda")


def _wait_for(path: Path) -> bool:
    deadline = time.monotonic() + JOB_WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args)
    finally:
        if len(args) >= 2:  # its sandbox's exit hides it from the grader (bwrap does not wait for its init)
            with contextlib.suppress(OSError):
                Path(args[1]).with_name(CPU).write_text(f"{_cpu_seconds():.3f}\n")


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _main(args: list[str]) -> int:
    from grader.checks import gpu_gate

    gate: gpu_gate.NoGate = gpu_gate.NO_GATE
    if len(args) == 4 and args[2] == "--gate":  # first, before anything touches the GPU (it may start paused)
        from_arbiter, to_arbiter = (int(fd) for fd in args[3].split(","))
        gate, args = gpu_gate.Gate(from_arbiter, to_arbiter), args[:2]
    if len(args) != 2:
        print("usage: python -m grader.speed.timer JOBS.json RESULT.json [--gate R,W]", file=sys.stderr)
        return 2
    job_path, first = Path(args[0]), Path(args[1])
    from grader.checks import runtime

    runtime.configure()
    if gate is not gpu_gate.NO_GATE:
        gpu_gate.install(gate)
    if not job_path.exists():  # started ahead, while the student's workers run: get ready, then wait for the jobs
        _get_ready(gate)
        if not _wait_for(job_path):
            return 0
    try:
        data = json.loads(job_path.read_text())
        jobs = [TimerJob.from_dict(d) for d in (data["jobs"] if isinstance(data, dict) and "jobs" in data
                                                 else [data])]
        wait_for_go = bool(data.get("wait_for_go", False)) if isinstance(data, dict) else False
    except (PlanError, KeyError, TypeError, ValueError) as exc:
        _write(first, TimerResult("", error=f"the timer's job is malformed: {type(exc).__name__}: {exc}"))
        return 0
    prepared = [prepare(job, first.parent, index=index) for index, job in enumerate(jobs)]
    if wait_for_go:
        job_path.with_name(PREPARED).write_text("")
        if not _wait_for(job_path.with_name(GO)):
            return 0
    for index, entry in enumerate(prepared):
        _write(job_result(first, index), time_prepared(entry, first.parent, index=index))
    return 0


if __name__ == "__main__":
    sys.exit(main())
