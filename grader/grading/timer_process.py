"""Running the trusted timer (:mod:`grader.speed.timer`) for one student's speed-graded part.

The worker recorded a :class:`~grader.speed.plan.LaunchPlan` per benchmark and has ended (with every
process it started) before the timer starts: nothing of the student's runs beside it. The timer runs in a
sandbox of its own (:mod:`grader.grading.isolation`) that shows it the grader package and a fresh scratch
folder, never the submission, the student's Triton cache or the output folder; it gets its job as a file
in that scratch and leaves its result there. Its time is bounded by the timing budget plus
:data:`SETUP_S`; a timer that overruns it is killed with its kernels, and the benchmarks it had started
replaying fail (a hung kernel is the student's); a timer that fails before it replays anything, or whose
result cannot be read, is the grader's fault.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from grader.grading import isolation, sandbox, supervise
from grader.grading.config import RunSettings
from grader.speed.measure import BenchmarkTiming, SpeedMeasurement
from grader.speed.plan import LaunchPlan
from grader.speed.timer import PROGRESS, TimerJob, TimerResult

SETUP_S = 120.0  # start-up, loading the kernels, building launchers, validation replays
OUTPUT_CAP = 1 << 20

_BOOT = supervise.boot("grader.speed.timer")  # as the worker is started: only the grader package importable


class TimerFault(RuntimeError):
    """The timer failed on the grader's side: the speed of this part waits for a regrade."""


def time_measurement(settings: RunSettings, exercise: str, part: str, measurement: SpeedMeasurement, *,
                     budget_s: float, scratch: Path) -> SpeedMeasurement:
    """``measurement`` (the worker's recording) with its benchmarks timed by the trusted timer: a row per
    benchmark with the replayed times, or why there are none."""
    plans = {label: p for label, p in measurement.plans.items() if isinstance(p, LaunchPlan)}
    rows: dict[str, BenchmarkTiming] = {}
    for row in measurement.benchmarks:
        recorded = measurement.plans.get(row.label)
        if row.error:
            rows[row.label] = row
        elif isinstance(recorded, str):
            rows[row.label] = BenchmarkTiming(row.label, warmup_s=row.warmup_s,
                                              error=f"not measurable: {recorded}")
    if plans and not any(r.error for r in rows.values()):
        result = _run(settings, TimerJob(exercise, part, budget_s, plans), budget_s=budget_s, scratch=scratch)
        for data in result.benchmarks:
            timed = BenchmarkTiming.from_dict(data)
            recorded_row = next((r for r in measurement.benchmarks if r.label == timed.label), None)
            timed.warmup_s += recorded_row.warmup_s if recorded_row else 0.0
            rows[timed.label] = timed
        measurement.mismatches = list(result.mismatches)
    measurement.benchmarks = [rows[r.label] for r in measurement.benchmarks if r.label in rows]
    return measurement


def _run(settings: RunSettings, job: TimerJob, *, budget_s: float, scratch: Path) -> TimerResult:
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="timer-", dir=scratch))
    try:
        (work / "job.json").write_text(json.dumps(job.to_dict()))
        box = settings.sandbox
        inside = isolation.SCRATCH if box is not None else str(work)
        env = sandbox.minimal_env({"GRADER_DEVICE": settings.device, **settings.env}, home=inside)
        argv = [sys.executable, "-I", "-u", "-c", _BOOT, _lib(settings, work), f"{inside}/job.json",
                f"{inside}/result.json"]
        if box is not None:
            import grader

            binds = [isolation.Bind(str(Path(grader.__file__).resolve().parent), isolation.PACKAGE),
                     isolation.Bind(str(work), isolation.SCRATCH, "rw")]
            argv, env = box.command(argv, binds=binds, env=env, cwd=inside), {}
        process = sandbox.Process(argv, cwd=str(work), env=env, rss_limit_bytes=None, output_cap=OUTPUT_CAP,
                                  pid_namespace=box is not None)
        limit = budget_s + SETUP_S
        exited = process.wait(limit)
        outcome = process.stop(timed_out=not exited)
        result_file, progress = work / "result.json", work / PROGRESS
        if result_file.is_file():
            try:
                result = TimerResult.from_dict(json.loads(result_file.read_text()))
            except (ValueError, KeyError, TypeError) as exc:
                raise TimerFault(f"the timer's result is unreadable: {exc}") from None
            if result.error:
                raise TimerFault(result.error)
            return result
        started = progress.read_text().split() if progress.is_file() else []
        if not started:  # nothing of the student's ran: the timer itself is broken
            raise TimerFault(f"the timer ended before replaying anything (exit {outcome.returncode}):\n"
                             f"{outcome.stderr.text()[-2000:]}")
        why = (f"did not finish within {limit:g} s" if outcome.timed_out else
               f"crashed the timer ({outcome.signal_name or f'exit code {outcome.returncode}'})")
        label = next((b for b in job.plans if b.replace(" ", "_") == started[-1]), started[-1])
        rows = [BenchmarkTiming(label, error=f"the replayed kernels {why} while timing {label}").to_dict()]
        return TimerResult("", rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _lib(settings: RunSettings, work: Path) -> str:
    """Where the timer finds the grader package: the sandbox's bind, or a folder holding only a link to it."""
    return isolation.LIB if settings.sandbox is not None else str(supervise.package_link(work))
