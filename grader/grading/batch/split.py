"""A local batch split over grader processes: one per GPU where it grades on several (``--gpus all``), or
``--processes N``.

One grader process judges the replies of every run it supervises and owns each GPU's arbiter; with several GPUs it
judges dozens of runs at once, and a run's judging took ten times as long on four GPUs as on one
(docs/performance.md). Split, each process grades its share of the students on one GPU (or on its share of the
CPU workers) exactly as an array task of a Slurm batch does (:func:`grader.grading.commands.grade_task.run_share`):
it joins the batch this process opened (same run.json, secret and reference store), commits each result to the
folder as it comes, and never writes the gradebook. This process hands out the students (longest work first, to
the share with the least so far), passes each child the secret on its standard input (never a command line, file
or environment variable), shows the whole batch's progress from what the folder holds (results committed, runs
marked as running), relays the rest of the children's output line by line under their name, and rebuilds the
gradebook and the class report from the folder when they have ended. Students a child left ungraded because its
GPU failed are handed to the children that ended well, once.

Ctrl-C reaches the children too (they share the terminal's process group) and each stops its own workers; SIGTERM
is passed on to them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grader.grading import config
from grader.grading.batch import exits, gpus
from grader.grading.batch.context import Context, UsageError
from grader.grading.batch.progress import Progress
from grader.grading.batch.scheduler import Task
from grader.grading.isolation import threads
from grader.grading.results import store

FOLDER = "processes"  # under OUT/staff: each share's students and log
STOP_WAIT_S = 60.0  # after SIGTERM, how long a child may take to stop its workers before it is killed
WATCH_S = 1.0  # how often the folder is read for the batch's progress
_CHILD_PROGRESS = re.compile(r"\[\d+/\d+\] ")  # a child's own progress line: the parent reports the batch's
ENDED_WELL = (0, exits.NEEDS_REGRADE, exits.UNGRADABLE)  # a child graded all it was given


@dataclass
class Share:
    """One child's students, and where it grades them."""

    label: str  # "GPU 2", "share 1": how its lines are prefixed
    students: list[str] = field(default_factory=list)
    estimate_s: float = 0.0
    env: dict[str, str] = field(default_factory=dict)  # e.g. CUDA_VISIBLE_DEVICES for its GPU
    jobs: int = 1


def count(ctx: Context, options: config.GradeOptions, *, available: Sequence[gpus.Gpu] | None = None,
          current: int | None = None) -> int:
    """How many grader processes grade a local batch: ``--processes``; else one per chosen GPU (one on a CPU)."""
    if ctx.device == "cuda":
        available = gpus.visible() if available is None else available
        current = gpus.current_index() if current is None else current
        chosen = len(gpus.select(options.gpus, available, current))
        asked = options.processes if options.processes is not None else chosen
        if asked not in (1, chosen):
            raise UsageError(f"--processes {asked}: on GPUs a batch runs in one grader process, or in one per GPU "
                             f"({chosen} here)")
        return asked
    return max(1, options.processes or 1)


def shares(ctx: Context, options: config.GradeOptions, tasks: list[Task], n: int, *,
           available: Sequence[gpus.Gpu] | None = None, current: int | None = None) -> list[Share]:
    """``n`` shares of the tasks' students: each student whole (one Triton cache, one share), longest work first
    to the share with the least work so far."""
    if ctx.device == "cuda":
        available = gpus.visible() if available is None else available
        current = gpus.current_index() if current is None else current
        chosen = gpus.select(options.gpus, available, current)
        out = [Share(f"GPU {g.index}", env={"CUDA_VISIBLE_DEVICES": g.pin},
                     jobs=options.jobs or gpus.auto_jobs(g, gpus=len(chosen))) for g in chosen]
    else:
        total = options.jobs or int(ctx.course.setting("jobs", ctx.device))
        out = [Share(f"share {i + 1}", jobs=max(1, total // n)) for i in range(n)]
    cores = max(1, threads.available_cores() // len(out))
    for share in out:
        share.env[threads.CORES_VARIABLE] = str(cores)  # the host's cores, shared between the processes
    work: dict[str, float] = {}
    for task in tasks:
        work[task.student] = work.get(task.student, 0.0) + task.estimate_s
    for student in sorted(work, key=lambda s: (-work[s], s)):
        share = min(out, key=lambda s: (s.estimate_s, len(s.students)))
        share.students.append(student)
        share.estimate_s += work[student]
    return [s for s in out if s.students]


def run(ctx: Context, tasks: list[Task], shares_: list[Share], *, secret: str, profile: bool,
        progress: Progress | None = None) -> list[Task]:
    """Grade ``tasks`` in one child per share, then once more on the children that ended well for what a child left
    ungraded; returns the tasks left ungraded. ``progress`` follows the whole batch."""
    folder = ctx.out / store.STAFF / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    watch = _Watch(ctx.out, tasks, progress) if progress is not None else None
    try:
        return _rounds(ctx, tasks, shares_, folder, secret=secret, profile=profile, progress=progress)
    finally:
        if watch is not None:
            watch.close()


def _rounds(ctx: Context, tasks: list[Task], shares_: list[Share], folder: Path, *, secret: str, profile: bool,
            progress: Progress | None) -> list[Task]:
    note = progress.note if progress is not None else _print
    ended = _round(ctx, shares_, folder, secret=secret, profile=profile, round_=1, note=note)
    left = _left(ctx.out, tasks)
    healthy = [share for share, code in ended if code in ENDED_WELL]
    if left and healthy and any(code == exits.UNFINISHED for _, code in ended):
        again = {t.student for t in left}
        for share in healthy:
            share.students, share.estimate_s = [], 0.0
        for student in sorted(again):
            target = min(healthy, key=lambda s: len(s.students))
            target.students.append(student)
        note(f"grader grade: {len(again)} submission(s) left by a share that failed go to "
             f"{', '.join(s.label for s in healthy if s.students)}")
        _round(ctx, [s for s in healthy if s.students], folder, secret=secret, profile=profile, round_=2, note=note)
        left = _left(ctx.out, tasks)
    return left


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Watch:
    """The batch's progress from the folder, once a second: each result a child commits is reported as done (with
    the share that graded it), and the runs marked as running are counted."""

    def __init__(self, out: Path, tasks: list[Task], progress: Progress):
        self.out, self.progress = out, progress
        self.waiting = {(t.student, t.exercise.name) for t in tasks}
        self.students = {t.student for t in tasks}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="split progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_S):
            self.look()

    def look(self) -> None:
        new = [(student, exercise) for student in sorted({s for s, _ in self.waiting})
               for exercise in sorted(store.committed(self.out, student)) if (student, exercise) in self.waiting]
        self.waiting.difference_update(new)
        running = sum(1 for student, exercise, _, _ in store.read_markers(self.out)
                      if (student, exercise) in self.waiting)
        self.progress.set_running(running + len(new))  # each one reported below was running until now
        for student, exercise in new:
            try:
                result = store.load_exercises(self.out, student)[exercise]
                text = f"{result.status} ({result.elapsed_s:.1f} s)"
            except (OSError, ValueError, KeyError):
                text = "committed"
            self.progress.advance(f"{student} {exercise}: {text}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.look()  # what the last commits added
        self.progress.stop()


def _left(out: Path, tasks: list[Task]) -> list[Task]:
    done: dict[str, set[str]] = {}
    return [t for t in tasks if t.exercise.name not in done.setdefault(t.student, store.committed(out, t.student))]


def _round(ctx: Context, shares_: list[Share], folder: Path, *, secret: str, profile: bool, round_: int,
           note=_print) -> list[tuple[Share, int | None]]:
    """One child per share, at once; each share with its exit status (None: it could not be started)."""
    children: list[tuple[Share, subprocess.Popen | None]] = []
    relays = []
    try:
        for i, share in enumerate(shares_):
            listed = folder / f"round-{round_}-share-{i + 1}.json"
            store.write_atomic(listed, json.dumps({"students": [{"student": s} for s in share.students]}) + "\n")
            argv = [sys.executable, "-P", "-m", "grader.cli", "grade-task", str(ctx.out), "--students", str(listed),
                    "--jobs", str(share.jobs)] + (["--profile"] if profile else [])
            env = {k: v for k, v in os.environ.items() if k != "GRADER_SECRET"}
            try:
                child = subprocess.Popen(argv, env={**env, **share.env}, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            except OSError as exc:
                note(f"grader grade: {share.label}: could not start its grader process: {exc}")
                children.append((share, None))
                continue
            assert child.stdin is not None and child.stdout is not None
            try:
                child.stdin.write(secret.encode() + b"\n")
                child.stdin.close()
            except OSError:  # it ended already: its output says why
                pass
            relay = threading.Thread(target=_relay, args=(child.stdout, f"[{share.label}] ", note), daemon=True,
                                     name=f"relay {share.label}")
            relay.start()
            relays.append(relay)
            children.append((share, child))
        for _, child in children:
            if child is not None:
                child.wait()
    except KeyboardInterrupt:
        _stop([c for _, c in children if c is not None])
        raise
    finally:
        for relay in relays:
            relay.join(timeout=5.0)
    return [(share, child.returncode if child is not None else None) for share, child in children]


def _relay(stream, prefix: str, note) -> None:
    """The child's lines, each under the child's name; but its own progress lines, which the batch's replace."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\r\n")
        if not _CHILD_PROGRESS.match(line):
            note(f"{prefix}{line}")
    stream.close()


def _stop(children: list[subprocess.Popen]) -> None:
    """SIGTERM to the children still running (Ctrl-C reached them already with the terminal's process group), then
    SIGKILL to any that has not stopped its workers within :data:`STOP_WAIT_S`."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
