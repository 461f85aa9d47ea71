"""Running the trusted timer (:mod:`grader.speed.timer`) for one student's exercise.

The worker recorded a :class:`~grader.speed.plan.LaunchPlan` per benchmark of each speed-graded part and has
ended (with every process it started) before the timer gets its jobs: nothing of the student's runs beside it.
One timer times every part of the exercise. It is started with the exercise's workers (:class:`Timer`), so that
its start-up overlaps theirs, and waits for its jobs file. It runs in a sandbox of its own
(:mod:`grader.grading.isolation.bwrap`) that shows it the grader package, a fresh scratch folder and the batch's
timer cache (:data:`TIMER_CACHE`), never the submission, the student's Triton cache or the output folder; it gets
its jobs as a file in that scratch and leaves a result per part there.

It shares the GPU while it starts, loads the kernels and validates the replays, and has it alone for each
benchmark's timed rounds (it is connected to the GPU's arbiter, :mod:`grader.grading.isolation.gpu_arbiter`, like a
worker). Its time from its jobs on is bounded by the parts' timing budgets plus :data:`SETUP_S`, not counting the
time it waits for the GPU; a timer that overruns it is killed with its kernels, and the benchmark it was replaying
fails (a hung kernel is the student's). A timer that fails before it replays anything, or whose result cannot be
read, is the grader's fault: that part's speed waits for a regrade (``timer_fault``). Parts a crashed timer did not
reach get a new timer.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grader.grading.config import RunSettings
from grader.grading.exercise_run import workers
from grader.grading.isolation import bwrap, processes
from grader.grading.isolation.gpu_arbiter import GpuArbiter
from grader.speed.measure import BenchmarkTiming, SpeedMeasurement
from grader.speed.plan import LaunchPlan
from grader.speed.timer import PROGRESS, TimerJob, TimerResult, job_result

SETUP_S = 120.0  # start-up, loading the kernels, building launchers, validation replays
# The timers' own Triton cache (the C launchers Triton builds for each kernel signature, its CUDA utilities), in
# the batch's private workspace: shared by the batch's timers, which run only the grader's code, and never shown
# to a worker (a student's cache is the student's own).
TIMER_CACHE = "timer-triton-cache"
OUTPUT_CAP = 1 << 20
JOBS = "job.json"  # in the timer's scratch: the timer waits for it

_BOOT = workers.boot("grader.speed.timer")  # as the worker is started: only the grader package importable


class TimerFault(RuntimeError):
    """The timer failed on the grader's side: the speed of this part waits for a regrade."""


@dataclass
class PartTiming:
    """One speed-graded part to time: the worker's recording, completed in place with the replayed times."""

    part: str
    measurement: SpeedMeasurement
    budget_s: float


def time_measurement(settings: RunSettings, exercise: str, part: str, measurement: SpeedMeasurement, *,
                     budget_s: float, scratch: Path, arbiter: GpuArbiter | None = None
                     ) -> SpeedMeasurement:
    """``measurement`` (the worker's recording) with its benchmarks timed by the trusted timer: a row per
    benchmark with the replayed times, or why there are none. Raises :class:`TimerFault` where the timer failed."""
    time_parts(settings, exercise, [PartTiming(part, measurement, budget_s)], scratch=scratch, arbiter=arbiter)
    if measurement.timer_fault:
        raise TimerFault(measurement.timer_fault)
    return measurement


def time_parts(settings: RunSettings, exercise: str, parts: list[PartTiming], *, scratch: Path,
               arbiter: GpuArbiter | None = None, timer: Timer | None = None) -> None:
    """Time every part of ``parts`` (one timer for all: ``timer`` where one was started ahead; a new one for parts
    after a crash); each measurement gets a row per benchmark, or its ``timer_fault``."""
    jobs: list[tuple[PartTiming, TimerJob]] = []
    for entry in parts:
        m = entry.measurement
        m.timer_fault = None
        plans = {label: p for label, p in m.plans.items() if isinstance(p, LaunchPlan)}
        rows: dict[str, BenchmarkTiming] = {}
        for row in m.benchmarks:
            recorded = m.plans.get(row.label)
            if row.error:
                rows[row.label] = row
            elif isinstance(recorded, str):
                rows[row.label] = BenchmarkTiming(row.label, warmup_s=row.warmup_s,
                                                  error=f"not measurable: {recorded}")
        if plans and not any(r.error for r in rows.values()):
            jobs.append((entry, TimerJob(exercise, entry.part, entry.budget_s, plans)))
        else:
            m.benchmarks = [rows[r.label] for r in m.benchmarks if r.label in rows]
    while jobs:
        try:
            results = _run(settings, [job for _, job in jobs], scratch=scratch, arbiter=arbiter, timer=timer)
        except TimerFault as exc:  # the first part's timer never replayed anything: the grader's fault
            jobs[0][0].measurement.timer_fault = str(exc)
            jobs = jobs[1:]
            continue
        for (entry, _), result in zip(jobs, results):
            if result is not None:
                _complete(entry.measurement, result)
        jobs = jobs[len([r for r in results if r is not None]):]


def _complete(m: SpeedMeasurement, result: TimerResult | TimerFault) -> None:
    if isinstance(result, TimerFault):
        m.timer_fault = str(result)
        return
    recorded = {r.label: r for r in m.benchmarks}
    rows: dict[str, BenchmarkTiming] = {}
    for data in result.benchmarks:
        timed = BenchmarkTiming.from_dict(data)
        timed.warmup_s += recorded[timed.label].warmup_s if timed.label in recorded else 0.0
        rows[timed.label] = timed
    m.mismatches = list(result.mismatches)
    m.benchmarks = [rows[r.label] for r in m.benchmarks if r.label in rows]


class Timer:
    """One timer process, started before its jobs exist: its start-up (the sandbox, Python, torch, triton, its CUDA
    context) overlaps the student's workers, and it waits for its jobs file. It gets that file only once every
    worker of the student's has ended, so nothing of the student's runs while it times."""

    def __init__(self, settings: RunSettings, *, scratch: Path, arbiter: GpuArbiter | None):
        scratch.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="timer-", dir=scratch))
        self.gate = arbiter.connect(f"the timer of {scratch.name}", role="timer") if arbiter is not None else None
        self.process: processes.Process | None = None
        self.used = False
        try:
            self.process = self._start(settings)
        except BaseException:
            self.close()
            raise

    def _start(self, settings: RunSettings) -> processes.Process:
        box, work, gate = settings.sandbox, self.work, self.gate
        inside = bwrap.SCRATCH if box is not None else str(work)
        env = processes.minimal_env({"GRADER_DEVICE": settings.device, **settings.env}, home=inside)
        cache = settings.workdir / TIMER_CACHE  # Triton's launchers, built once for every timer of the batch
        cache.mkdir(parents=True, exist_ok=True)
        env["TRITON_CACHE_DIR"] = bwrap.TRITON_CACHE if box is not None else str(cache)
        gate_fds = gate.process_fds if gate is not None else ()
        argv = [sys.executable, "-I", "-u", "-c", _BOOT, _lib(settings, work), f"{inside}/{JOBS}",
                f"{inside}/result.json"] + (["--gate", ",".join(map(str, gate_fds))] if gate_fds else [])
        if box is not None:
            import grader

            binds = [bwrap.Bind(str(Path(grader.__file__).resolve().parent), bwrap.PACKAGE),
                     bwrap.Bind(str(work), bwrap.SCRATCH, "rw"),
                     bwrap.Bind(str(cache), bwrap.TRITON_CACHE, "rw")]
            argv, env = box.command(argv, binds=binds, env=env, cwd=inside), {}
        try:
            return processes.Process(argv, cwd=str(work), env=env, rss_limit_bytes=None, output_cap=OUTPUT_CAP,
                                     pid_namespace=box is not None, pass_fds=gate_fds)
        finally:
            if gate is not None:
                gate.started()

    def run(self, jobs: list[TimerJob]) -> list[TimerResult | TimerFault | None]:
        """Hand the timer ``jobs`` and wait for it: a result per job, a :class:`TimerResult` of failed rows for the
        job it was replaying when it crashed or hung, None for the jobs it did not reach. Raises
        :class:`TimerFault` where it ended before replaying anything. A timer runs one set of jobs."""
        assert self.process is not None and not self.used, "a timer runs one set of jobs"
        self.used = True
        tmp = self.work / f"{JOBS}.tmp"
        tmp.write_text(json.dumps({"jobs": [job.to_dict() for job in jobs]}))
        tmp.replace(self.work / JOBS)  # whole, at once: the timer starts on it as soon as it appears
        limit = sum(job.budget_s for job in jobs) + SETUP_S
        started = time.monotonic()
        waited = self.gate.waiting_now() if self.gate is not None else 0.0
        while not (exited := self.process.wait(0.5)):
            if time.monotonic() - started > limit + (self.gate.waiting_now() - waited if self.gate else 0.0):
                break
        outcome = self.process.stop(timed_out=not exited)
        return _results(jobs, self.work, outcome, limit)

    def close(self) -> None:
        """Stop the process (if it still runs: never given its jobs, say) and remove its folder."""
        try:
            if self.process is not None and self.process.alive():
                self.process.stop()
        finally:
            if self.gate is not None:
                self.gate.close()
            shutil.rmtree(self.work, ignore_errors=True)


def _run(settings: RunSettings, jobs: list[TimerJob], *, scratch: Path, arbiter: GpuArbiter | None,
         timer: Timer | None = None) -> list[TimerResult | TimerFault | None]:
    """One timer for ``jobs`` (``timer`` where one was started ahead and not used yet; it stays the caller's to
    close), see :meth:`Timer.run`."""
    if timer is not None and not timer.used:
        return timer.run(jobs)
    fresh = Timer(settings, scratch=scratch, arbiter=arbiter)
    try:
        return fresh.run(jobs)
    finally:
        fresh.close()


def _results(jobs: list[TimerJob], work: Path, outcome: processes.Outcome, limit: float
             ) -> list[TimerResult | TimerFault | None]:
    results: list[TimerResult | TimerFault | None] = []
    for index in range(len(jobs)):
        path = job_result(work / "result.json", index)
        if not path.is_file():
            break
        try:
            result = TimerResult.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            result = TimerFault(f"the timer's result is unreadable: {exc}")
        else:
            if result.error:
                result = TimerFault(result.error)
        results.append(result)
    if len(results) == len(jobs):
        return results
    progress = work / PROGRESS
    started = [line.split(" ", 1) for line in progress.read_text().splitlines()] if progress.is_file() else []
    started = [entry for entry in started if len(entry) == 2 and entry[0] == str(len(results))]
    if not started:
        if not results:  # nothing of the student's ran: the timer itself is broken
            raise TimerFault(f"the timer ended before replaying anything (exit {outcome.returncode}):\n"
                             f"{outcome.stderr.text()[-2000:]}")
        results.append(TimerFault(f"the timer ended between two parts (exit {outcome.returncode})"))
    else:
        why = (f"did not finish within {limit:g} s" if outcome.timed_out else
               f"crashed the timer ({outcome.signal_name or f'exit code {outcome.returncode}'})")
        job = jobs[len(results)]
        label = next((b for b in job.plans if b.replace(" ", "_") == started[-1][1]), started[-1][1])
        results.append(TimerResult("", [BenchmarkTiming(label, error=f"the replayed kernels {why} while timing "
                                                               f"{label}").to_dict()]))
    return results + [None] * (len(jobs) - len(results))


def _lib(settings: RunSettings, work: Path) -> str:
    """Where the timer finds the grader package: the sandbox's bind, or a folder holding only a link to it."""
    return bwrap.LIB if settings.sandbox is not None else str(workers.package_link(work))
