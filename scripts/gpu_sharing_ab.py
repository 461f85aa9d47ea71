"""Rows of docs/data/gpu-sharing-ab.csv: batches graded on one GPU, alternately by this checkout's grader (arm A)
and by the grader of an earlier commit checked out in the folder ``--before`` names (arm O; ``git worktree add DIR
COMMIT``), so that a drift of the host falls on both arms alike.

    python scripts/gpu_sharing_ab.py --order AOAOAOAOAO --before ../before --warm-up >> docs/data/gpu-sharing-ab.csv

Each batch grades ``--copies`` copies of ``solutions/`` with ``grader grade --profile`` in a fresh grader process,
into a folder of its own. A row: the batch's wall time, the scores, the arbiter's own counts from the profile (GPU
held alone, turns, turns chained right after another, the wait for the others' GPU work before the turns, the wait
for a turn; the chained count is empty from a grader that does not chain), the cores the graders could use
(``taskset`` narrows them) and ``--note`` (what else the host ran meanwhile). To run both arms at once on a host
of two GPUs, start two of these, each with ``CUDA_VISIBLE_DEVICES`` and ``taskset`` giving it one GPU and half the
cores, and the orders mirrored.
``--warm-up`` grades one batch of the first arm before the others, as batch 0: a GPU's first batch records the
references' speed and fills Triton's cache, which later batches find ready. Rows of arm B (commit a45534f) graded
with that grader's chained turns and hurried workers turned off (docs/decisions/0012-gpu-sharing-simplified.md);
in the rows of 10 submissions arm A is the tree without them at df834eb, with them at b074325 (0013).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["date", "commit", "gpu", "arm", "grader_commit", "grader_args", "batch", "submissions", "wall_s", "scores",
          "alone_s", "turns", "chained", "drain_s", "queue_s", "exit", "cores", "note"]

ARMS = {
    "A": "this checkout's grader",
    "O": "the earlier commit's grader: it runs from its own folder, which comes first on sys.path",
}
GRADE = "import sys\nfrom grader.cli import main\nsys.exit(main(sys.argv[1:]))\n"

_ALONE = re.compile(r"held alone (?P<alone>[\d.]+) s .*? in (?P<turns>\d+) turn\(s\)"
                    r"(?:, (?P<chained>\d+) of them right after another)?; waiting for the others' GPU work before "
                    r"them (?P<drain>[\d.]+) s in all, for their turn \(that wait included\) (?P<queue>[\d.]+) s")


def arbiter_counts(profile: str) -> dict[str, str]:
    """The first GPU's line of ``--profile``: held alone (s), turns, chained turns (where the grader chained them),
    drain wait (s), queue wait (s); empty where the profile has none (no GPU)."""
    found = _ALONE.search(profile)
    if found is None:
        return {}
    return {"alone_s": found["alone"], "turns": found["turns"], "chained": found["chained"] or "",
            "drain_s": found["drain"], "queue_s": found["queue"]}


def grade(submissions: list[Path], out: Path, limit_s: float, *, home: Path = ROOT,
          args: tuple[str, ...] = ()) -> tuple[float, str, int]:
    """One batch in a fresh grader process, the grader imported from ``home`` and given ``args`` besides: wall
    time, the profile's text, exit status."""
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", GRADE, "grade", *map(str, submissions),
                               "--profile", "--out", str(out), *args], capture_output=True, text=True,
                              timeout=limit_s, cwd=home)
        text, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:  # its output comes as bytes, even with text=True
        text = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part or ""
                       for part in (exc.stdout, exc.stderr))
        code = 124
    return time.monotonic() - start, text, code


def commit_of(folder: Path) -> str:
    """The commit checked out in ``folder``; empty where ``folder`` is not the top of a git work tree."""
    git = subprocess.run(["git", "rev-parse", "--show-toplevel", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=folder).stdout.split()
    return git[1] if len(git) == 2 and Path(git[0]).resolve() == folder.resolve() else ""


def scores(out: Path) -> str:
    grades = out / "grades.csv"
    if not grades.is_file():
        return ""
    return " ".join(row["total"] for row in csv.DictReader(grades.open()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--order", default="AOAOAOAOAO", help="the arms in the order they run, 5 each by default ("
                        + "; ".join(f"{arm}: {what}" for arm, what in ARMS.items()) + ")")
    parser.add_argument("--copies", type=int, default=3, help="copies of solutions/ in each batch")
    parser.add_argument("--limit-s", type=float, default=600.0, help="a batch's wall-clock limit")
    parser.add_argument("--header", action="store_true", help="print the CSV header first")
    parser.add_argument("--args", default="", help="more arguments for this checkout's grader grade (arm A), "
                        "e.g. --args=--no-yardstick")
    parser.add_argument("--before", type=Path, help="arm O's folder: a checkout of the earlier commit to compare")
    parser.add_argument("--commit", help="the commit of this checkout, where git cannot tell (default: from git)")
    parser.add_argument("--before-commit", help="the commit checked out in --before (default: from git)")
    parser.add_argument("--warm-up", action="store_true", help="grade one batch of the first arm first, as batch 0")
    parser.add_argument("--note", default="", help="what else the host ran meanwhile, for the rows' note column "
                        "(e.g. the other arm's batches on the host's other GPU)")
    args = parser.parse_args(argv)
    if not args.order or set(args.order) - set(ARMS):
        parser.error(f"--order takes the arms {', '.join(ARMS)}, e.g. AOAOAOAOAO")
    if "O" in args.order and (args.before is None or not (args.before / "grader" / "cli.py").is_file()):
        parser.error("arm O needs --before DIR, a checkout of an earlier commit (DIR/grader/cli.py)")
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    cores = len(os.sched_getaffinity(0))  # the graders size their runs to the cores they may use
    commit = args.commit or commit_of(ROOT)
    before = args.before.resolve() if args.before else None
    homes = {"A": ROOT, "O": before}
    graders = {"A": commit, "O": args.before_commit or (commit_of(before) if before else "")}
    writer = csv.writer(sys.stdout)
    if args.header:
        writer.writerow(FIELDS)
    with tempfile.TemporaryDirectory(prefix="gpu-sharing-ab-") as tmp:
        batch = Path(tmp) / "submissions"
        batch.mkdir()
        submissions = []
        for i in range(1, args.copies + 1):
            copy = batch / f"ref{i}"
            subprocess.run(["cp", "-r", str(ROOT / "solutions"), str(copy)], check=True)
            submissions.append(copy)
        first = 0 if args.warm_up else 1
        for index, arm in enumerate(args.order[0] * (1 - first) + args.order, start=first):
            out = Path(tmp) / f"out-{index}-{arm}"
            extra = () if arm == "O" else tuple(args.args.split())
            wall, profile, code = grade(submissions, out, args.limit_s, home=homes[arm], args=extra)
            counts = arbiter_counts(profile)
            row = {"date": datetime.date.today().isoformat(), "commit": commit, "gpu": gpu, "arm": arm,
                   "grader_commit": graders[arm], "grader_args": " ".join(extra), "batch": index,
                   "submissions": args.copies, "wall_s": f"{wall:.1f}", "scores": scores(out), "exit": code,
                   "cores": cores, "note": args.note, **counts}
            writer.writerow([row.get(field, "") for field in FIELDS])
            sys.stdout.flush()
            if code != 0:
                print(profile[-3000:], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
