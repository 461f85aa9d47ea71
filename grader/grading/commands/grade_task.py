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
    recorded = batch_mod.recorded_run(out)
    entry = json.loads(tasks_file.read_text())["students"][index]
    secret = store.read_secret(out)
    fingerprint = resume.secret_fingerprint(secret or "", recorded.get("secret_salt", ""))
    if not secret or fingerprint != recorded.get("secret_fingerprint"):
        print(f"grader grade-task: {out / store.SECRET_FILE} is missing or is not the batch's secret", file=sys.stderr)
        return 2
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")  # on the CPU, as many workers as the task has CPUs
    jobs = int(cpus) if cpus and cpus.isdigit() and recorded.get("device_kind") == "cpu" else None
    options = batch_mod.recorded_options(recorded, config.GradeOptions(jobs=jobs, gpus="all"))
    with batch_mod.Workspace(False) as work:
        try:
            found = batch_mod.choose_sandbox(options, out, work.dir)
        except batch_mod.UsageError as exc:
            print(f"grader grade-task: {exc}", file=sys.stderr)
            return 2
        ctx = batch_mod.make_context(out, options, secret=secret, work=work, sandbox=(found[0], recorded.get(
            "sandbox", found[1])))
        problems = resume.conflicts(recorded, ctx.identity(), secret)
        if problems:
            print(str(resume.refuse(out, problems, hint="")), file=sys.stderr)
            return 2
        sub = batch_mod.reprepare(out, entry["student"], work.dir / "sub", ctx.selected)
        tasks = batch_mod.pending_tasks(ctx, [sub])
        _, left = batch_mod.run_local(ctx, tasks, work, options, f"grading {sub.student} (Slurm task {index})",
                                      students=[sub.student], gradebook=False)
    results = store.load_exercises(out, sub.student)
    if left:
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
