"""The ``grader`` command: a thin shell over keyword-only functions.

Each subcommand lives in its own module, which provides ``add_arguments(parser)`` and
``run(args) -> int``; this file only lists them (and ``grader list``, which is one table).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# command -> (module, help); no help: a command the grader runs itself (not listed)
COMMANDS = {
    "list": ("grader.cli", "list the exercises, their parts and their points"),
    "grade": ("grader.grading.commands.grade", "grade student submissions (directories, .zip or .ipynb)"),
    "status": ("grader.grading.commands.status", "where a grading batch stands: done, running, failed, needs regrade"),
    "grade-task": ("grader.grading.commands.grade_task", None),
    "verify": ("grader.grading.commands.verify", "grade solutions/ and fail unless every exercise earns full marks"),
    "release": ("grader.grading.commands.release", "write the student release (no solutions, no hidden material)"),
    "calibrate": ("grader.grading.commands.calibrate", "measure the references on this GPU, write its thresholds file"),
    "bench": ("grader.speed.bench", "benchmark an exercise against its baselines (table, optional plot)"),
    "profile": ("grader.speed.profile", "the kernels one call launches: grids, bytes, GPU times, beside the reference"),
    "serve": ("grader.serve.serve_cli", "run the grading server students submit to during the term; its roster"),
    "submit": ("grader.handin.submit_cli", "hand in to the course's grading server (grader serve)"),
    "results": ("grader.handin.results_cli", "your submissions to the course's grading server, and their reports"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:  # for "list"
    parser.add_argument("--course", default=None, metavar="FILE", help="weigh the points with this course file")


def run(args: argparse.Namespace) -> int:  # "list"
    from grader import exercises

    course = None
    try:
        from grader.grading import config
    except ModuleNotFoundError:  # the student release has no instructor grader: declared points only
        config = None
    if config is not None:
        try:
            course = config.load_course(args.course)
        except config.CourseError as exc:
            print(f"grader list: {exc}", file=sys.stderr)
            return 2
    all_ex = exercises.all_exercises()
    unit = f"points of {course.total:g}" if course else "points as declared"
    defaults = False
    for exercise in all_ex:
        factor = course.factor(exercise, all_ex) if course else 1.0
        print(f"{exercise.name:16} {exercise.title}: {exercise.max_points * factor:.2f} {unit}")
        for part in exercise.parts:
            pieces = [f"correctness {part.points * factor:.2f}"]
            pieces += [f"{x.name} {x.points * factor:.2f}" for x in part.extra_checks]
            if part.speed_graded:
                pieces.append(f"speed {part.speed_points * factor:.2f} (GPU only)")
                curve = course.curve(exercise.name, part.name) if course else None
                if curve is not None:
                    pieces.append(f"speed curve: {curve.describe(part.speed_baseline or 'the baseline')}")
                else:
                    defaults = True
                    pieces.append("speed curve: the default*")
            print(f"  {part.name:14} {', '.join(pieces)}")
    if defaults:
        from grader.speed.thresholds.speed_curves import FULL_FRACTION, PARTIAL_FRACTION

        print(f"* full speed credit from {FULL_FRACTION:g} of the reference solution's speed on the grading GPU, "
              f"none at or below {PARTIAL_FRACTION:g} of it, linear between: the reference timed in the same rounds "
              "(the default of `grader grade` on a GPU), else (`--no-yardstick`) its calibrated time in the GPU's "
              "thresholds file (less twice its measured spread); a course sets its own in course.toml [speed_curve]")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grader", description="Grade and benchmark Triton kernel exercises.")
    sub = parser.add_subparsers(dest="command", required=True)
    shown = []
    for command, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
                raise
            continue  # not shipped here: the student release has no instructor commands
        p = sub.add_parser(command, description=help_text, **({"help": help_text} if help_text else {}))
        module.add_arguments(p)
        p.set_defaults(module=module)
        if help_text:
            shown.append(command)
    sub.metavar = "{" + ",".join(shown) + "}"
    return parser


def main(argv: list[str] | None = None) -> int:
    from grader.checks import runtime

    try:
        runtime.configure()  # before anything imports triton
    except runtime.RuntimeSetupError as exc:
        print(f"grader: {exc}", file=sys.stderr)
        return 2
    args = _parser().parse_args(argv)
    try:
        return int(args.module.run(args) or 0)
    except BrokenPipeError:  # the reader went away (`grader list | head`): nothing left to say, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's final flush must not fail again
        return 0


if __name__ == "__main__":
    sys.exit(main())
