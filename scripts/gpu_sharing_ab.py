"""Rows of docs/data/gpu-sharing-ab.csv: batches graded on one GPU with the GPU-sharing arbiter as shipped (arm A)
and without its two speed-ups (arm B: no turn chained right after another, ``MAX_CHAIN_S = 0``; no niced worker
told to hurry), alternating, so that a drift of the host falls on both arms alike.

    python scripts/gpu_sharing_ab.py --order ABABABABAB --copies 3 >> docs/data/gpu-sharing-ab.csv

Each batch grades ``--copies`` copies of ``solutions/`` with ``grader grade --profile`` in a fresh grader process
(the arm's patch applied in it before the grader starts), into a folder of its own. A row: the batch's wall time,
the scores, and the arbiter's own counts from the profile (GPU held alone, turns, chained turns, the wait for the
others' GPU work before the turns, the wait for a turn).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["date", "commit", "gpu", "arm", "batch", "submissions", "wall_s", "scores", "alone_s", "turns",
          "chained", "drain_s", "queue_s", "exit"]

# Arm B's patch, applied in the grader process (the arbiter runs on the grader's threads) before it starts.
ARMS = {
    "A": "",
    "B": ("import grader.grading.isolation.gpu_arbiter as a\n"
          "a.MAX_CHAIN_S = 0.0\n"
          "a.Client._hurry = lambda self, on: None\n"),
}
GRADE = "import sys\n{patch}from grader.cli import main\nsys.exit(main(sys.argv[1:]))\n"

_ALONE = re.compile(r"held alone (?P<alone>[\d.]+) s .*? in (?P<turns>\d+) turn\(s\), (?P<chained>\d+) of them right "
                    r"after another; waiting for the others' GPU work before them (?P<drain>[\d.]+) s in all, for "
                    r"their turn \(that wait included\) (?P<queue>[\d.]+) s")


def arbiter_counts(profile: str) -> dict[str, str]:
    """The first GPU's line of ``--profile``: held alone (s), turns, chained turns, drain wait (s), queue wait (s);
    empty where the profile has none (no GPU)."""
    found = _ALONE.search(profile)
    if found is None:
        return {}
    return {"alone_s": found["alone"], "turns": found["turns"], "chained": found["chained"],
            "drain_s": found["drain"], "queue_s": found["queue"]}


def grade(arm: str, submissions: list[Path], out: Path, limit_s: float) -> tuple[float, str, int]:
    """One batch in a fresh grader process with the arm's patch: wall time, the profile's text, exit status."""
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", GRADE.format(patch=ARMS[arm]), "grade", *map(str, submissions),
                               "--profile", "--out", str(out)], capture_output=True, text=True, timeout=limit_s,
                              cwd=ROOT)
        text, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:  # its output comes as bytes, even with text=True
        text = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part or ""
                       for part in (exc.stdout, exc.stderr))
        code = 124
    return time.monotonic() - start, text, code


def scores(out: Path) -> str:
    grades = out / "grades.csv"
    if not grades.is_file():
        return ""
    return " ".join(row["total"] for row in csv.DictReader(grades.open()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--order", default="ABABABABAB", help="the arms in the order they run (default: 5 each)")
    parser.add_argument("--copies", type=int, default=3, help="copies of solutions/ in each batch")
    parser.add_argument("--limit-s", type=float, default=600.0, help="a batch's wall-clock limit")
    parser.add_argument("--header", action="store_true", help="print the CSV header first")
    args = parser.parse_args(argv)
    if not args.order or set(args.order) - set(ARMS):
        parser.error(f"--order takes the arms {', '.join(ARMS)}, e.g. ABABABABAB")
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
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
        for index, arm in enumerate(args.order, start=1):
            out = Path(tmp) / f"out-{index}-{arm}"
            wall, profile, code = grade(arm, submissions, out, args.limit_s)
            counts = arbiter_counts(profile)
            row = {"date": datetime.date.today().isoformat(), "commit": commit, "gpu": gpu, "arm": arm,
                   "batch": index, "submissions": args.copies, "wall_s": f"{wall:.1f}", "scores": scores(out),
                   "exit": code, **counts}
            writer.writerow([row.get(field, "") for field in FIELDS])
            sys.stdout.flush()
            if code != 0:
                print(profile[-3000:], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
