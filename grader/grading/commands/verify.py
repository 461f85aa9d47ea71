"""``grader verify``: grade ``solutions/`` like a submission and fail unless every exercise earns
full marks — correctness and integrity everywhere, speed too on a calibrated GPU (on the CPU and
on an uncalibrated GPU speed is not measured and not required). CI runs it on the CPU; it is the
project's "main job on bundled data"."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from grader.grading import config
from grader.grading.commands.grade import UsageError, add_common, exit_status, grade, options_from_args
from grader.grading.config import default_solutions
from grader.grading.results.results import NEEDS_REGRADE
from grader.grading.results.scoring import points_text as _pts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--solutions", default=None, metavar="DIR",
                        help="the reference solutions (default: solutions/ next to the grader package)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="where the reports go (default: a new grader-verify-* folder in the system's temporary "
                        "folder, kept and named at the end)")
    add_common(parser)


def _uncalibrated(part) -> bool:
    """Speed waits for a GPU with thresholds: not the references' failure, nor the grader's."""
    return part.speed.status == NEEDS_REGRADE and not part.speed.calibrated and part.status == "graded"


def failures(batch) -> list[str]:
    """Every line short of full marks (speed only where this GPU is calibrated), as "line: points" plus the
    line's key message."""
    problems = []
    for report in batch.reports:
        for score, result in report.exercises:
            if score.status != "graded":
                first = score.message.splitlines()[0] if score.message else ""
                problems.append(f"{score.exercise}: {score.status}: {first}")
                continue
            uncalibrated = {part.name for part in result.parts if _uncalibrated(part)}
            for line in score.lines:
                if line.component == "speed" and line.part in uncalibrated:
                    continue  # speed is required on a calibrated GPU only
                if (line.max_score > 0 and line.score < line.max_score - 1e-9) or not line.passed:
                    detail = line.output.strip().splitlines()[:8]
                    problems.append(f"{line.name}: {_pts(line.score)}/{_pts(line.max_score)}"
                                    + "".join(f"\n    {d}" for d in detail))
            problems.extend(f"{score.exercise}: {p.splitlines()[0]}" for p in result.problems)
    return problems



def run(args: argparse.Namespace) -> int:
    solutions = Path(args.solutions) if args.solutions else default_solutions()
    if not solutions.is_dir():
        print(f"grader verify: no solutions directory at {solutions} (this is the staff command)", file=sys.stderr)
        return 2
    # the summary names the class report: its folder outlives the command, whether --out named it or not
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="grader-verify-"))
    try:
        # always from scratch: a verification never trusts results already in --out
        batch = grade([str(solutions)], out=out, options=options_from_args(args).replace(fresh=True),
                      title="grader verify", solutions_id="solutions")
    except (UsageError, config.CourseError) as exc:
        if not args.out and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # nothing was written: no empty folder is left
        print(f"grader verify: {exc}", file=sys.stderr)
        return 2
    if not args.out:
        print(f"grader verify: reports kept in {out} (--out DIR chooses where)", file=sys.stderr)
    faults = [p for r in batch.reports for _, res in r.exercises for p in res.parts
              if p.needs_regrade and not _uncalibrated(p)]
    if faults or any(res.grader_errors for r in batch.reports for _, res in r.exercises):
        return exit_status(batch)
    problems = failures(batch)
    if problems:
        print("grader verify: FAILED — the reference solutions do not earn full marks:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    missing = max((r.unavailable for r in batch.reports), default=0.0)
    speed_note = ""
    if missing > 0:
        top = max(r.max_score + r.unavailable for r in batch.reports)
        speed_note = (f" (speed not measured: it needs a GPU, so {_pts(missing)} of the {_pts(top)} points are not "
                      "available here)")
    uncalibrated = sorted({f"{res.exercise}/{p.name}" for r in batch.reports for _, res in r.exercises
                           for p in res.parts if _uncalibrated(p)})
    if uncalibrated:
        speed_note = f" (speed not required: this GPU is not calibrated for {', '.join(uncalibrated)})"
    print(f"grader verify: OK — every exercise earns full marks{speed_note}; {batch.elapsed_s:.1f} s of wall time",
          file=sys.stderr)
    return 0
