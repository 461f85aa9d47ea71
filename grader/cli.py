"""The ``grader`` command: a thin shell over keyword-only functions.

Each subcommand lives in its own module, which provides ``add_arguments(parser)`` and
``run(args) -> int``; this file only lists them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, help)
COMMANDS = {
    "list": ("grader.cli", "list the exercises and their parts"),
    "grade": ("grader.grading.grade", "grade student submissions (directories, .zip or .ipynb)"),
    "verify": ("grader.grading.verify", "grade solutions/ and fail unless every exercise earns full marks"),
    "release": ("grader.grading.release", "write the student release (no solutions, no hidden material)"),
    "calibrate": ("grader.calibrate", "measure the reference solutions on this GPU and write its thresholds file"),
    "bench": ("grader.bench", "benchmark an exercise against its baselines (table, optional plot)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:  # for "list"
    pass


def run(args: argparse.Namespace) -> int:  # "list"
    from grader import exercises

    for exercise in exercises.all_exercises():
        parts = ", ".join(p.name for p in exercise.parts)
        print(f"{exercise.name:16} {exercise.title} ({parts})")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grader", description="Grade and benchmark Triton kernel exercises.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
                raise
            continue  # not shipped here: the student release has no instructor commands
        p = sub.add_parser(command, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    from grader import runtime

    try:
        runtime.configure()  # before anything imports triton
    except runtime.RuntimeSetupError as exc:
        print(f"grader: {exc}", file=sys.stderr)
        return 2
    args = _parser().parse_args(argv)
    return int(args.module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
