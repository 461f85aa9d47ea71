"""A local batch split over grader processes: one per GPU where it grades on several (``--gpus all``), or
``--processes N``.

One grader process judges the replies of every run it supervises and owns each GPU's arbiter; with several GPUs it
judges dozens of runs at once, and a run's judging took ten times as long on four GPUs as on one
(docs/performance.md). Split, each process grades its share of the students on one GPU (or on its share of the
CPU workers) exactly as an array task of a Slurm batch does (:func:`grader.grading.commands.grade_task.run_share`):
it joins the batch this process opened (same run.json, secret and reference store), commits each result to the
folder as it comes, and never writes the gradebook. This process hands out the students (longest work first, to
the share with the least so far), passes each child the secret on its standard input (never a command line, file
or environment variable), relays their output line by line under their name, and rebuilds the gradebook and the
class report from the folder when they have ended. Students a child left ungraded because its GPU failed are
handed to the children that ended well, once.

Ctrl-C reaches the children too (they share the terminal's process group) and each stops its own workers; SIGTERM
is passed on to them.
"""

from __future__ import annotations

import json
import os
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
from grader.grading.batch.scheduler import Task
from grader.grading.isolation import threads
from grader.grading.results import store

FOLDER = "processes"  # under OUT/staff: each share's students and log
STOP_WAIT_S = 60.0  # after SIGTERM, how long a child may take to stop its workers before it is killed
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


def run(ctx: Context, tasks: list[Task], shares_: list[Share], *, secret: str, profile: bool) -> list[Task]:
    """Grade ``tasks`` in one child per share, then once more on the children that ended well for what a child left
    ungraded; returns the tasks left ungraded."""
    folder = ctx.out / store.STAFF / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    ended = _round(ctx, shares_, folder, secret=secret, profile=profile, round_=1)
    left = _left(ctx.out, tasks)
    healthy = [share for share, code in ended if code in ENDED_WELL]
    if left and healthy and any(code == exits.UNFINISHED for _, code in ended):
        again = {t.student for t in left}
        for share in healthy:
            share.students, share.estimate_s = [], 0.0
        for student in sorted(again):
            target = min(healthy, key=lambda s: len(s.students))
            target.students.append(student)
        print(f"grader grade: {len(again)} submission(s) left by a share that failed go to "
              f"{', '.join(s.label for s in healthy if s.students)}", file=sys.stderr)
        _round(ctx, [s for s in healthy if s.students], folder, secret=secret, profile=profile, round_=2)
        left = _left(ctx.out, tasks)
    return left


def _left(out: Path, tasks: list[Task]) -> list[Task]:
    done: dict[str, set[str]] = {}
    return [t for t in tasks if t.exercise.name not in done.setdefault(t.student, store.committed(out, t.student))]


def _round(ctx: Context, shares_: list[Share], folder: Path, *, secret: str, profile: bool,
           round_: int) -> list[tuple[Share, int | None]]:
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
                print(f"grader grade: {share.label}: could not start its grader process: {exc}", file=sys.stderr)
                children.append((share, None))
                continue
            assert child.stdin is not None and child.stdout is not None
            try:
                child.stdin.write(secret.encode() + b"\n")
                child.stdin.close()
            except OSError:  # it ended already: its output says why
                pass
            relay = threading.Thread(target=_relay, args=(child.stdout, f"[{share.label}] "), daemon=True,
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


def _relay(stream, prefix: str) -> None:
    """The child's lines on this process's stderr, each under the child's name."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\r\n")
        sys.stderr.write(f"{prefix}{line}\n")
        sys.stderr.flush()
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
