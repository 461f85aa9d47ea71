"""``grader grade-task OUT --tasks FILE --index I`` and ``grader grade-task OUT --merge N``: what the jobs
of a Slurm batch run (:mod:`grader.grading.batch.slurm` writes their scripts); ``grader grade-task OUT --students
FILE``: one share of a local batch split over grader processes (:mod:`grader.grading.batch.split` starts them).
None is meant to be typed.

An array task grades one submission's unfinished exercises with the same code as a local batch
(:mod:`grader.grading.batch.pipeline`): the settings from ``run.json``, the secret from the folder's mode-600 file,
this node's GPUs (those Slurm gave the task) or CPUs as slots. A share grades its students the same way, on the GPU
its parent pinned it to (or its share of the CPU workers), the secret read from its standard input.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from grader.grading import config
from grader.grading.batch import exits, resume, slurm
from grader.grading.batch import pipeline as batch_mod
from grader.grading.batch.batch_secret import batch_secret
from grader.grading.batch.context import Terminated
from grader.grading.results import rebuild, store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", help="the batch's output folder")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--index", type=int, metavar="I", help="grade the I-th submission of --tasks")
    what.add_argument("--merge", type=int, metavar="N", help="merge batch N's gradebook and class report")
    what.add_argument("--students", metavar="FILE",
                      help="grade these students' unfinished exercises (a share of a split batch; the secret on stdin)")
    parser.add_argument("--tasks", metavar="FILE", help="the batch's task list (staff/slurm/batch-N.json)")
    parser.add_argument("--jobs", type=int, default=None, help="with --students: exercise runs at once")
    parser.add_argument("--profile", action="store_true", help="with --students: print where the time went")
    parser.add_argument("--keep-work", action="store_true", help="with --students: keep the scratch directory")


def run(args: argparse.Namespace) -> int:
    if args.merge is not None:
        return merge(Path(args.out), args.merge)
    if args.students:
        try:
            return run_share(Path(args.out), Path(args.students), secret=sys.stdin.readline().rstrip("\n"),
                             jobs=args.jobs, profile=args.profile, keep_work=args.keep_work)
        except (batch_mod.UsageError, resume.Conflict, config.CourseError) as exc:
            print(f"grader grade-task: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: its workers are stopped, what it committed is kept
            for signum in (signal.SIGINT, signal.SIGTERM):  # a second one during the exit is not a traceback
                signal.signal(signum, signal.SIG_IGN)
            print("grader grade-task: stopped", file=sys.stderr)
            return 128 + signal.SIGTERM if isinstance(exc, Terminated) else 128 + signal.SIGINT
    if not args.tasks:
        print("grader grade-task: --index needs --tasks FILE", file=sys.stderr)
        return 2
    try:
        return run_array_task(Path(args.out), Path(args.tasks), args.index)
    except (batch_mod.UsageError, resume.Conflict, config.CourseError) as exc:
        print(f"grader grade-task: {exc}", file=sys.stderr)
        return 2


def run_array_task(out: Path, tasks_file: Path, index: int) -> int:
    """One Slurm array task: grade one submission's unfinished exercises into ``out``, exactly as a local
    batch would (the secret from ``out``'s mode-600 file, the settings from run.json)."""
    out = out.resolve()
    try:
        recorded = batch_mod.recorded_run(out)
        student = json.loads(tasks_file.read_text())["students"][index]["student"]
        secret = batch_secret(config.GradeOptions(), out, recorded, folder_only=True)
        cpus = os.environ.get("SLURM_CPUS_PER_TASK")  # on the CPU, as many workers as the task has CPUs
        jobs = int(cpus) if cpus and cpus.isdigit() and recorded.get("device_kind") == "cpu" else None
        options = batch_mod.recorded_options(recorded, config.GradeOptions(jobs=jobs, gpus="all"))
        batch = batch_mod.run_batch(out, batch_mod.Plan(
            options, secret, lambda ctx, workdir: [batch_mod.reprepare(out, student, workdir / "sub", ctx.selected)],
            lambda ctx, subs, tasks: f"grading {student} (Slurm task {index})", None, joins=recorded,
            exclusive=False))
    except batch_mod.NotThisBatch as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except batch_mod.UsageError as exc:
        print(f"grader grade-task: {exc}", file=sys.stderr)
        return 2
    results = store.load_exercises(out, student)
    if batch.left:
        return exits.UNFINISHED
    return exits.NEEDS_REGRADE if any(r.needs_regrade for r in results.values()) else 0


def run_share(out: Path, students_file: Path, *, secret: str, jobs: int | None, profile: bool,
              keep_work: bool = False) -> int:
    """One share of a split batch: grade the runs ``students_file`` lists (each student's exercises) into ``out``,
    exactly as a local batch would, joining the batch recorded there (``secret`` must be its)."""
    out = out.resolve()
    recorded = batch_mod.recorded_run(out)
    listed = json.loads(students_file.read_text())["students"]
    students = [entry["student"] for entry in listed]
    runs = frozenset((entry["student"], exercise) for entry in listed for exercise in entry["exercises"])
    options = batch_mod.recorded_options(recorded, config.GradeOptions(
        jobs=jobs, gpus="all", profile=profile, secret=secret, processes=1, keep_work=keep_work))
    found = batch_secret(options, out, recorded)
    batch = batch_mod.run_batch(out, batch_mod.Plan(
        options, found,
        lambda ctx, workdir: [batch_mod.reprepare(out, s, workdir / f"sub{i}", ctx.selected)
                              for i, s in enumerate(students)],
        lambda ctx, subs, tasks: f"grading {len(tasks)} exercise run(s) of {len(subs)} submission(s)", None,
        joins=recorded, exclusive=False, only=runs))
    if batch.left:
        return exits.UNFINISHED
    results = [r for s in students for r in store.load_exercises(out, s).values()]
    return exits.NEEDS_REGRADE if any(r.needs_regrade for r in results) else 0


def merge(out: Path, batch_number: int) -> int:
    """The Slurm batch's last job: the gradebook and the class report, from what the tasks committed."""
    from grader import exercises as registry

    out = out.resolve()
    recorded = batch_mod.recorded_run(out)
    course = config.load_course(batch_mod.recorded_options(recorded, config.GradeOptions()).course)
    students = rebuild.rebuild(out, course=course, all_exercises=registry.all_exercises())
    slurm.mark_merged(out, batch_number, {"students": len(students), "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    print(f"merged {len(students)} student(s) into {out / store.GRADEBOOK} and {out / store.CLASS_REPORT_HTML}",
          file=sys.stderr)
    return 0
