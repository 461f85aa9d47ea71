"""``grader grade-task OUT --tasks FILE --index I`` and ``grader grade-task OUT --merge N``: what the jobs
of a Slurm batch run (:mod:`grader.grading.batch.slurm` writes their scripts; not meant to be typed).

An array task grades one submission's unfinished exercises with the same code as a local batch
(:mod:`grader.grading.batch.pipeline`): the settings from ``run.json``, the secret from the folder's mode-600 file,
this node's GPUs (those Slurm gave the task) or CPUs as slots.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from grader.grading import config
from grader.grading.batch import pipeline as batch_mod
from grader.grading.batch import resume, slurm
from grader.grading.commands import grade
from grader.grading.results import rebuild, store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", help="the batch's output folder")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--index", type=int, metavar="I", help="grade the I-th submission of --tasks")
    what.add_argument("--merge", type=int, metavar="N", help="merge batch N's gradebook and class report")
    parser.add_argument("--tasks", metavar="FILE", help="the batch's task list (staff/slurm/batch-N.json)")


def run(args: argparse.Namespace) -> int:
    if args.merge is not None:
        return merge(Path(args.out), args.merge)
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
        secret = batch_mod.batch_secret(config.GradeOptions(), out, recorded, folder_only=True)
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
        return grade.EXIT_UNFINISHED
    return grade.EXIT_NEEDS_REGRADE if any(r.needs_regrade for r in results.values()) else 0


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
