"""Running the trusted timer (:mod:`grader.speed.timer`) for one student's exercise.

The worker recorded a :class:`~grader.speed.plan.LaunchPlan` per benchmark of each speed-graded part. One timer
times every part of the exercise. It is started with the exercise's workers (:class:`Timer`), so that its
start-up overlaps theirs, and waits for its jobs file. It gets its jobs as soon as every speed measurement is
recorded (:meth:`Timer.prepare`): it loads and validates the replays while the student's other workers may still
run their correctness checks; it is told to time them (:data:`~grader.speed.timer.GO`) only once every worker of
the student's has ended, with every process it started: nothing of the student's runs beside the timed rounds.
It runs in a sandbox of its own
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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader.grading.config import RunSettings
from grader.grading.exercise_run import workers
from grader.grading.isolation import bwrap, bytecode, processes
from grader.grading.isolation.gpu_arbiter import GpuArbiter
from grader.speed.credit_messages import launch_configs
from grader.speed.measure import BenchmarkTiming, SpeedMeasurement
from grader.speed.plan import LaunchPlan
from grader.speed.timer import CPU, GO, PREPARED, PROGRESS, TimerJob, TimerResult, job_result

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
    yardstick: dict[str, LaunchPlan] = field(default_factory=dict)  # the reference's plans, timed beside
    boundaries: list[float] = field(default_factory=list)  # the credit's boundaries, reference / student


def time_measurement(settings: RunSettings, exercise: str, part: str, measurement: SpeedMeasurement, *,
                     budget_s: float, scratch: Path, arbiter: GpuArbiter | None = None
                     ) -> SpeedMeasurement:
    """``measurement`` (the worker's recording) with its benchmarks timed by the trusted timer: a row per
    benchmark with the replayed times, or why there are none. Raises :class:`TimerFault` where the timer failed."""
    time_parts(settings, exercise, [PartTiming(part, measurement, budget_s)], scratch=scratch, arbiter=arbiter)
    if measurement.timer_fault:
        raise TimerFault(measurement.timer_fault)
    return measurement


def prepare_parts(exercise: str, parts: list[PartTiming], timer: Timer) -> None:
    """Hand ``timer`` the jobs of ``parts`` to load and validate now, sharing the GPU, while the student's other
    workers may still run; :func:`time_parts` with the same parts and timer then has them timed."""
    timer.prepare([job for _, job in _jobs(exercise, parts, complete=False)])


def time_parts(settings: RunSettings, exercise: str, parts: list[PartTiming], *, scratch: Path,
               arbiter: GpuArbiter | None = None, timer: Timer | None = None) -> float:
    """Time every part of ``parts`` (one timer for all: ``timer`` where one was started ahead, and given these
    parts to prepare if it was; a new one for parts after a crash); each measurement gets a row per benchmark, or
    its ``timer_fault``. Returns the CPU seconds of the timers it started (``timer``'s are its own)."""
    jobs = _jobs(exercise, parts, complete=True)
    cpu = [0.0]
    while jobs:
        try:
            results = _run(settings, [job for _, job in jobs], scratch=scratch, arbiter=arbiter, timer=timer, cpu=cpu)
        except TimerFault as exc:  # the first part's timer never replayed anything: the grader's fault
            jobs[0][0].measurement.timer_fault = str(exc)
            jobs = jobs[1:]
            continue
        remaining = []
        for (entry, job), result in zip(jobs, results):
            if result is None:  # not reached, or prepared but not timed before a crash: a new timer times it
                remaining.append((entry, job))
            else:
                _complete(entry.measurement, result)
        jobs = remaining
    return cpu[0]


def _untimed(m: SpeedMeasurement) -> dict[str, BenchmarkTiming]:
    """The rows of the benchmarks the timer cannot time: their call failed, or their recording cannot be replayed.
    Each costs its own credit; the part's other benchmarks are timed."""
    rows: dict[str, BenchmarkTiming] = {}
    for row in m.benchmarks:
        recorded = m.plans.get(row.label)
        if row.error:
            rows[row.label] = row
        elif isinstance(recorded, str):
            rows[row.label] = BenchmarkTiming(row.label, warmup_s=row.warmup_s, error=f"not measurable: {recorded}")
    return rows


def _jobs(exercise: str, parts: list[PartTiming], *, complete: bool) -> list[tuple[PartTiming, TimerJob]]:
    """A timer job per part that has plans to time; with ``complete``, the measurements of the parts with none get
    their final rows (the failures, and the recordings that cannot be replayed) now."""
    jobs: list[tuple[PartTiming, TimerJob]] = []
    for entry in parts:
        m = entry.measurement
        if complete:
            m.timer_fault = None
        plans = {label: p for label, p in m.plans.items() if isinstance(p, LaunchPlan)}
        m.reference_configs = {label: launch_configs(p) for label, p in entry.yardstick.items() if label in plans}
        if plans:
            jobs.append((entry, TimerJob(exercise, entry.part, entry.budget_s, plans,
                                         yardstick={k: v for k, v in entry.yardstick.items() if k in plans},
                                         boundaries=list(entry.boundaries))))
        elif complete:
            rows = _untimed(m)
            m.benchmarks = [rows[r.label] for r in m.benchmarks if r.label in rows]
    return jobs


def _complete(m: SpeedMeasurement, result: TimerResult | TimerFault) -> None:
    if isinstance(result, TimerFault):
        m.timer_fault = str(result)
        return
    recorded = {r.label: r for r in m.benchmarks}
    rows = _untimed(m)
    for data in result.benchmarks:
        timed = BenchmarkTiming.from_dict(data)
        timed.warmup_s += recorded[timed.label].warmup_s if timed.label in recorded else 0.0
        rows[timed.label] = timed
    m.mismatches = list(result.mismatches)
    m.gpu_state = list(result.gpu_state)
    m.benchmarks = [rows[r.label] for r in m.benchmarks if r.label in rows]


class Timer:
    """One timer process, started before its jobs exist: its start-up (the sandbox, Python, torch, triton, its CUDA
    context) overlaps the student's workers, and it waits for its jobs file. It may get that file while the
    student's workers still run (:meth:`prepare`: it loads and validates the replays, sharing the GPU), but is told
    to time them only once every worker of the student's has ended, so nothing of the student's runs while it
    times."""

    def __init__(self, settings: RunSettings, *, scratch: Path, arbiter: GpuArbiter | None):
        scratch.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="timer-", dir=scratch))
        self.gate = arbiter.connect(f"the timer of {scratch.name}", role="timer") if arbiter is not None else None
        self.process: processes.Process | None = None
        self.used = False
        self.prepared: list[TimerJob] | None = None  # the jobs handed to prepare
        self._running = threading.Event()  # told to time what it prepared: its preparation is no longer watched
        self._reported: float | None = None  # the CPU seconds the timer said it used, as it ended
        self._watch: threading.Thread | None = None
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
        pycache = bytecode.for_sandbox() if box is not None else None
        argv = [sys.executable, "-I", *bytecode.options(pycache), "-u", "-c", _BOOT, _lib(settings, work),
                f"{inside}/{JOBS}", f"{inside}/result.json"]
        argv += ["--gate", ",".join(map(str, gate_fds))] if gate_fds else []
        if box is not None:
            import grader

            binds = [bwrap.Bind(str(Path(grader.__file__).resolve().parent), bwrap.PACKAGE),
                     bwrap.Bind(str(work), bwrap.SCRATCH, "rw"),
                     bwrap.Bind(str(cache), bwrap.TRITON_CACHE, "rw")]
            if pycache is not None:
                binds.append(bwrap.Bind(str(pycache), bwrap.PYCACHE))
            argv, env = box.command(argv, binds=binds, env=env, cwd=inside), {}
        try:
            return processes.Process(argv, cwd=str(work), env=env, rss_limit_bytes=None, output_cap=OUTPUT_CAP,
                                     pid_namespace=box is not None, pass_fds=gate_fds)
        finally:
            if gate is not None:
                gate.started()

    def prepare(self, jobs: list[TimerJob]) -> None:
        """Hand the timer ``jobs`` to load and validate now; it times them only when :meth:`run` (with the same
        jobs) tells it to."""
        assert self.process is not None and not self.used and self.prepared is None, "a timer runs one set of jobs"
        self._write(JOBS, json.dumps({"jobs": [job.to_dict() for job in jobs], "wait_for_go": True}))
        self.prepared = list(jobs)
        self._watch = threading.Thread(target=self._watch_preparation, args=(_limit(jobs),),
                                       name="timer-preparation", daemon=True)
        self._watch.start()

    def _watch_preparation(self, limit: float) -> None:
        """Stop the timer if loading and validating the replays it prepares outlasts ``limit`` (a replayed kernel
        that hangs: until the student's last worker ends, nobody else waits for this timer), not counting the time
        it waits for the GPU; done once it has prepared them all (:data:`~grader.speed.timer.PREPARED`)."""
        assert self.process is not None
        started = time.monotonic()
        waited = self.gate.waiting_now() if self.gate is not None else 0.0
        while not self._running.is_set() and not (self.work / PREPARED).exists():
            if self.process.wait(0.2):
                return
            if time.monotonic() - started > limit + (self.gate.waiting_now() - waited if self.gate else 0.0):
                self.process.stop(timed_out=True)  # its progress says whose kernels hung
                return

    def can_run(self, jobs: list[TimerJob]) -> bool:
        """Whether :meth:`run` may hand this timer ``jobs``: not used yet, and given these jobs to prepare if any."""
        return not self.used and (self.prepared is None or self.prepared == jobs)

    def run(self, jobs: list[TimerJob]) -> list[TimerResult | TimerFault | None]:
        """Hand the timer ``jobs`` (or tell it to time those it prepared) and wait for it: a result per job, a
        :class:`TimerResult` of failed rows for the job whose kernels ran when it crashed or hung, None for the jobs
        it did not reach or did not time. Raises :class:`TimerFault` where it ended before replaying anything. A
        timer runs one set of jobs."""
        assert self.process is not None and self.can_run(jobs), "a timer runs one set of jobs"
        self.used = True
        if self.prepared is None:
            self._write(JOBS, json.dumps({"jobs": [job.to_dict() for job in jobs]}))
        else:
            self._running.set()
            if self._watch is not None:
                self._watch.join()  # it may be stopping a timer whose preparation overran
            self._write(GO, "")
        limit = _limit(jobs)
        started = time.monotonic()
        waited = self.gate.waiting_now() if self.gate is not None else 0.0
        while not (exited := self.process.wait(0.5)):
            if time.monotonic() - started > limit + (self.gate.waiting_now() - waited if self.gate else 0.0):
                break
        outcome = self.process.stop(timed_out=not exited)
        return _results(jobs, self.work, outcome, limit)

    @property
    def cpu_s(self) -> float:
        """CPU seconds the timer's processes used: as it said when it ended, else as read while it ran."""
        seen = self.process.cpu_s() if self.process is not None else 0.0
        if self._reported is None:
            self._read_reported()
        return max(seen, self._reported or 0.0)

    def _read_reported(self) -> None:
        try:
            self._reported = float((self.work / CPU).read_text())
        except (OSError, ValueError):
            pass

    def _write(self, name: str, text: str) -> None:
        tmp = self.work / f"{name}.tmp"
        tmp.write_text(text)
        tmp.replace(self.work / name)  # whole, at once: the timer starts on it as soon as it appears

    def close(self) -> None:
        """Stop the process (if it still runs: never given its jobs, say) and remove its folder."""
        self._running.set()
        try:
            if self.process is not None and self.process.alive():
                self.process.stop()
            self._read_reported()  # before its folder goes
        finally:
            if self.gate is not None:
                self.gate.close()
            shutil.rmtree(self.work, ignore_errors=True)


def _run(settings: RunSettings, jobs: list[TimerJob], *, scratch: Path, arbiter: GpuArbiter | None,
         timer: Timer | None = None, cpu: list[float]) -> list[TimerResult | TimerFault | None]:
    """One timer for ``jobs`` (``timer`` where one was started ahead and not used yet; it stays the caller's to
    close), see :meth:`Timer.run`; a new timer's CPU seconds are added to ``cpu[0]``."""
    if timer is not None and timer.can_run(jobs):
        return timer.run(jobs)
    fresh = Timer(settings, scratch=scratch, arbiter=arbiter)
    try:
        return fresh.run(jobs)
    finally:
        fresh.close()
        cpu[0] += fresh.cpu_s


def _limit(jobs: list[TimerJob]) -> float:
    """How long a timer may work on ``jobs`` (its preparation, then again its timing), not counting its waits for
    the GPU."""
    return sum(job.budget_s for job in jobs) + SETUP_S


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
    # Which job's kernels ran last: the timer prepares every job before it times the first, so a crash may belong
    # to a job after the first without a result (the jobs before it, prepared but not timed, get a new timer).
    progress = work / PROGRESS
    started = [line.split(" ", 1) for line in progress.read_text().splitlines()] if progress.is_file() else []
    started = [entry for entry in started if len(entry) == 2 and entry[0].isdigit() and int(entry[0]) < len(jobs)]
    running = int(started[-1][0]) if started else -1
    untimed: list[TimerResult | TimerFault | None] = [None] * (len(jobs) - len(results))
    if running < len(results):
        if not results:  # nothing of the student's ran: the timer itself is broken
            raise TimerFault(f"the timer ended before replaying anything (exit {outcome.returncode}):\n"
                             f"{outcome.stderr.text()[-2000:]}")
        untimed[0] = TimerFault(f"the timer ended between two parts (exit {outcome.returncode})")
    else:
        why = (f"did not finish within {limit:g} s" if outcome.timed_out else
               f"crashed the timer ({outcome.signal_name or f'exit code {outcome.returncode}'})")
        label = next((b for b in jobs[running].plans if b.replace(" ", "_") == started[-1][1]), started[-1][1])
        untimed[running - len(results)] = TimerResult("", [BenchmarkTiming(
            label, error=f"the replayed kernels {why} while timing {label}").to_dict()])
    return results + untimed


def _lib(settings: RunSettings, work: Path) -> str:
    """Where the timer finds the grader package: the sandbox's bind, or a folder holding only a link to it."""
    return bwrap.LIB if settings.sandbox is not None else str(workers.package_link(work))
