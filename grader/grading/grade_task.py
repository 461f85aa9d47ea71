"""``grader grade-task OUT --tasks FILE --index I`` and ``grader grade-task OUT --merge N``: what the jobs
of a Slurm batch run (:mod:`grader.grading.slurm` writes their scripts; not meant to be typed)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader.grading import config, grade, resume


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", help="the batch's output folder")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--index", type=int, metavar="I", help="grade the I-th submission of --tasks")
    what.add_argument("--merge", type=int, metavar="N", help="merge batch N's gradebook and class report")
    parser.add_argument("--tasks", metavar="FILE", help="the batch's task list (staff/slurm/batch-N.json)")


def run(args: argparse.Namespace) -> int:
    if args.merge is not None:
        return grade.merge(Path(args.out), args.merge)
    if not args.tasks:
        print("grader grade-task: --index needs --tasks FILE", file=sys.stderr)
        return 2
    try:
        return grade.run_array_task(Path(args.out), Path(args.tasks), args.index)
    except (grade.UsageError, resume.Conflict, config.CourseError) as exc:
        print(f"grader grade-task: {exc}", file=sys.stderr)
        return 2
