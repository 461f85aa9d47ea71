"""The ``grader`` command: a thin shell over keyword-only functions in the modules it names."""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grader", description="Grade and benchmark Triton kernel exercises.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list the exercises and their parts")
    p.set_defaults(run=_list)
    return parser


def _list(args: argparse.Namespace) -> int:
    from grader import exercises

    for exercise in exercises.all_exercises():
        parts = ", ".join(p.name for p in exercise.parts)
        print(f"{exercise.name:16} {exercise.title} ({parts})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
