"""A local batch split over grader processes: one per GPU where it grades on several (``--gpus all``), or
``--processes N``.

One grader process judges the replies of every run it supervises and owns each GPU's arbiter; with several GPUs it
judges dozens of runs at once, and a run's judging took ten times as long on four GPUs as on one
(docs/performance.md). Split, each process grades its share of the students on one GPU (or on its share of the
CPU workers) exactly as an array task of a Slurm batch does (:func:`grader.grading.commands.grade_task.run_share`):
it joins the batch this process opened (same run.json, secret and reference store), grades the runs it is given,
commits each result to the folder as it comes, and never writes the gradebook.

This process hands out the students (whole, longest work first, to the share with the least so far), passes each
child the secret on its standard input (never a command line, file or environment variable), shows the whole
batch's progress from what the folder holds (results written since the split began, runs marked as running),
relays the rest of the children's output line by line under their name, and rebuilds the gradebook and the class
report from the folder when they have ended. The students a child left because its GPU failed (it ends with
:data:`~grader.grading.batch.exits.UNFINISHED`) are handed to the children that ended well, once.

A child dies with this process (SIGTERM, then it stops its workers). Ctrl-C reaches the children with the
terminal's process group, and each stops its own workers; they get SIGTERM only if they have not ended within
:data:`STOP_WAIT_S`, and SIGKILL after as long again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grader.grading import config
from grader.grading.batch import exits, gpus, markers
from grader.grading.batch.context import Context, Terminated, UsageError, signals_held
from grader.grading.batch.progress import Progress
from grader.grading.batch.scheduler import Task, task_key
from grader.grading.isolation import threads
from grader.grading.isolation.parent_death import die_with_parent
from grader.grading.results import store

FOLDER = "processes"  # under OUT/staff: the runs each share was given
STOP_WAIT_S = 60.0  # for a child to stop its workers after Ctrl-C (then SIGTERM), and again after SIGTERM (SIGKILL)
WATCH_S = 1.0  # how often the folder is read for the batch's progress
_CHILD_PROGRESS = re.compile(r"\[\d+/\d+\] ")  # a child's own progress line: the parent reports the batch's
ENDED_WELL = (0, exits.NEEDS_REGRADE, exits.UNGRADABLE)  # a child graded all it was given

Key = tuple[str, str]  # (student, exercise): one run


@dataclass
class Share:
    """One child's students, and where it grades them."""

    label: str  # "GPU 2", "share 1": how its lines are prefixed
    env: dict[str, str] = field(default_factory=dict)  # e.g. CUDA_VISIBLE_DEVICES for its GPU
    jobs: int = 1
    students: list[str] = field(default_factory=list)
    estimate_s: float = 0.0


def count(ctx: Context, options: config.GradeOptions, *, available: Sequence[gpus.Gpu] | None = None,
          current: int | None = None) -> int:
    """How many grader processes grade a local batch: ``--processes``; else one per chosen GPU (one on a CPU)."""
    if options.processes is not None and options.processes < 1:
        raise UsageError(f"--processes {options.processes}: give 1 or more")
    if ctx.device == "cuda":
        chosen = len(_chosen(options, available, current))
        asked = options.processes if options.processes is not None else chosen
        if asked not in (1, chosen):
            raise UsageError(f"--processes {asked}: on GPUs a batch runs in one grader process, or in one per GPU "
                             f"({chosen} here)")
        return asked
    return options.processes or 1


def _chosen(options: config.GradeOptions, available: Sequence[gpus.Gpu] | None,
            current: int | None) -> list[gpus.Gpu]:
    available = gpus.visible() if available is None else available
    current = gpus.current_index() if current is None else current
    return gpus.select(options.gpus, available, current)


def shares(ctx: Context, options: config.GradeOptions, tasks: list[Task], n: int, *,
           available: Sequence[gpus.Gpu] | None = None, current: int | None = None) -> list[Share]:
    """The tasks' students in up to ``n`` shares: each student whole (one Triton cache, one share), longest work
    first to the share with the least work so far. The shares that get students divide the host's cores, and on a
    CPU the runs at once (``--jobs``)."""
    jobs = options.jobs or int(ctx.course.setting("jobs", ctx.device))  # 0 on GPUs: chosen per GPU
    if ctx.device == "cuda":
        chosen = _chosen(options, available, current)
        out = [Share(f"GPU {g.index}", env={"CUDA_VISIBLE_DEVICES": g.pin}) for g in chosen]
    else:
        out = [Share(f"share {i + 1}") for i in range(n)]
    work: dict[str, float] = {}
    for task in tasks:
        work[task.student] = work.get(task.student, 0.0) + task.estimate_s
    for student in sorted(work, key=lambda s: (-work[s], s)):
        share = min(out, key=lambda s: (s.estimate_s, len(s.students)))
        share.students.append(student)
        share.estimate_s += work[student]
    used = [s for s in out if s.students]
    cores = threads.available_cores()
    for i, share in enumerate(used):
        share.env[threads.CORES_VARIABLE] = str(max(1, cores // len(used)))  # each child's share of the cores
        if ctx.device == "cuda":
            gpu = next(g for g in chosen if share.env["CUDA_VISIBLE_DEVICES"] == g.pin)
            share.jobs = jobs or gpus.auto_jobs(gpu, gpus=len(used), cores=cores)
        else:
            share.jobs = max(1, jobs // len(used) + (1 if i < jobs % len(used) else 0))
    return used


def run(ctx: Context, tasks: list[Task], shares_: list[Share], *, secret: str, profile: bool,
        keep_work: bool = False, progress: Progress | None = None) -> list[Task]:
    """Grade ``tasks`` in one child per share, then once more on the children that ended well for the students a
    child left when its GPU failed; returns the tasks left ungraded. ``progress`` follows the whole batch."""
    folder = ctx.out / store.STAFF / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    done = _Results(ctx.out, tasks)
    watch = _Watch(ctx.out, done, progress) if progress is not None else None
    note = progress.note if progress is not None else _print
    try:
        runs = {s: [t.exercise.name for t in tasks if t.student == s] for s in {t.student for t in tasks}}
        child = _Child(ctx.out, folder, runs, secret=secret, profile=profile, keep_work=keep_work, note=note)
        ended = child.round(shares_, 1)
        failed = {s for share, code in ended if code == exits.UNFINISHED for s in share.students}
        again = sorted(failed & {t.student for t in done.left()})
        healthy = [share for share, code in ended if code in ENDED_WELL]
        if again and healthy:
            for share in healthy:
                share.students, share.estimate_s = [], 0.0
            for student in again:
                min(healthy, key=lambda s: len(s.students)).students.append(student)
            note(f"grader grade: {len(again)} submission(s) left by a share whose GPU failed go to "
                 f"{', '.join(s.label for s in healthy if s.students)}")
            child.runs = {}  # only the runs still without a result
            for task in done.left():
                child.runs.setdefault(task.student, []).append(task.exercise.name)
            child.round([s for s in healthy if s.students], 2)
        return done.left()
    finally:
        if watch is not None:
            watch.close()


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Results:
    """Which of the tasks have a result written since the split began (a task with a previous result, say one
    that needs a regrade, has a file already: it counts once that file is replaced)."""

    def __init__(self, out: Path, tasks: list[Task]):
        self.out, self.tasks = out, tasks
        self.before = {(t.student, t.exercise.name): self._stamp((t.student, t.exercise.name)) for t in tasks}

    def _stamp(self, key: Key) -> tuple[int, int, int] | None:
        try:  # results are replaced whole (a new file), never written in place
            st = (store.student_dir(self.out, key[0]) / "state" / f"{key[1]}.json").stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def done(self, key: Key) -> bool:
        stamp = self._stamp(key)
        return stamp is not None and stamp != self.before[key]

    def left(self) -> list[Task]:
        return [t for t in self.tasks if not self.done((t.student, t.exercise.name))]


class _Watch:
    """The batch's progress from the folder, once a second: each result a child writes is reported as done, and
    the live markers of the runs not done are counted as running."""

    def __init__(self, out: Path, results: _Results, progress: Progress):
        self.out, self.results, self.progress = out, results, progress
        self.waiting = set(results.before)
        self.started: set[tuple[str, str]] = set()  # seen running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="split progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_S):
            with contextlib.suppress(Exception):  # the progress display never stops a batch
                self.look()

    def look(self) -> None:
        new = sorted(key for key in self.waiting if self.results.done(key))
        self.waiting.difference_update(new)
        running = [(student, exercise) for student, exercise, data, age in store.read_markers(self.out)
                   if (student, exercise) in self.waiting and markers.liveness(data, age, None).alive]
        for student, exercise in running:
            if (student, exercise) not in self.started:  # started about now: its time so far counts as work done
                self.started.add((student, exercise))
                self.progress.start(task_key(student, exercise))
        self.progress.set_running(len(running) + len(new))  # each one reported below was running until now
        for student, exercise in new:
            took = None
            try:
                result = store.load_exercises(self.out, student)[exercise]
                text, took = f"{result.status} ({result.elapsed_s:.1f} s)", result.elapsed_s
            except (OSError, ValueError, KeyError):
                text = "written"
            self.progress.advance(f"{student} {exercise}: {text}", key=task_key(student, exercise),
                                  took_s=took)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self.look()  # what the last results added
        except Exception:
            pass
        finally:
            self.progress.stop()


@dataclass
class _Child:
    """How a round starts its children: each runs ``grader grade-task OUT --students FILE``."""

    out: Path
    folder: Path
    runs: dict[str, list[str]]  # student -> the exercises to grade
    secret: str
    profile: bool
    keep_work: bool
    note: Callable[[str], None]

    def round(self, shares_: list[Share], number: int) -> list[tuple[Share, int | None]]:
        """One child per share, at once; each share with its exit status (None: it could not be started)."""
        children: list[tuple[Share, subprocess.Popen | None]] = []
        relays = []
        try:
            for i, share in enumerate(shares_):
                children.append((share, self._start(share, self.folder / f"round-{number}-share-{i + 1}.json")))
                child = children[-1][1]
                if child is not None:
                    relays.append(threading.Thread(target=_relay, args=(child.stdout, f"[{share.label}] ", self.note),
                                                   daemon=True, name=f"relay {share.label}"))
                    relays[-1].start()
            for _, child in children:
                if child is not None:
                    child.wait()
        except BaseException as exc:
            # Ctrl-C reached the children too (one process group): they stop by themselves, unless it came alone
            with signals_held():  # the command says "stopped" only once they have
                _stop([c for _, c in children if c is not None],
                      signalled=isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Terminated))
            raise
        finally:
            for relay in relays:
                relay.join(timeout=5.0)
        return [(share, child.returncode if child is not None else None) for share, child in children]

    def _start(self, share: Share, listed: Path) -> subprocess.Popen | None:
        store.write_atomic(listed, json.dumps({"students": [{"student": s, "exercises": self.runs[s]}
                                                            for s in share.students]}, indent=1) + "\n")
        argv = [sys.executable, "-P", "-m", "grader.cli", "grade-task", str(self.out), "--students", str(listed),
                "--jobs", str(share.jobs)] + (["--profile"] if self.profile else []) \
            + (["--keep-work"] if self.keep_work else [])
        env = {k: v for k, v in os.environ.items() if k != "GRADER_SECRET"}
        try:
            child = subprocess.Popen(argv, env={**env, **share.env}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, preexec_fn=die_with_parent(signal.SIGTERM))
        except OSError as exc:
            self.note(f"grader grade: {share.label}: could not start its grader process: {exc}")
            return None
        assert child.stdin is not None
        with contextlib.suppress(OSError):  # one that ended already says why in its output
            child.stdin.write(self.secret.encode() + b"\n")
            child.stdin.close()
        return child


def _relay(stream, prefix: str, note: Callable[[str], None]) -> None:
    """The child's lines, each under the child's name; but its own progress lines, which the batch's replace. It
    reads to the end whatever happens: a child whose output is not read would block on it."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\r\n")
        if not _CHILD_PROGRESS.match(line):
            with contextlib.suppress(Exception):
                note(f"{prefix}{line}")
    stream.close()


def _stop(children: list[subprocess.Popen], *, signalled: bool) -> None:
    """Stop the children still running: after Ctrl-C (``signalled``: they got it too) wait for them to stop their
    workers, then SIGTERM, then SIGKILL, each after :data:`STOP_WAIT_S`."""
    steps = ([None] if signalled else []) + [signal.SIGTERM, signal.SIGKILL]
    for step in steps:
        running = [c for c in children if c.poll() is None]
        if not running:
            return
        for child in running:
            if step is not None:
                child.send_signal(step)
        deadline = time.monotonic() + STOP_WAIT_S
        for child in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
