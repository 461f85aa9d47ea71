"""Rows of docs/data/yardstick-runs.csv from a graded output folder: every speed row of every submission, with its
ratio to the reference timed in the same rounds (and that ratio's interval), to the baseline, its credit and rounds.

    python scripts/yardstick_rows.py OUT --machine 3 >> docs/data/yardstick-runs.csv
    python scripts/performance_tables.py --write

A submission whose id starts with ``ref`` is a copy of the references, any other a slowed fixture (the batch of
docs/performance.md, "Beside the yardstick").
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
from pathlib import Path


def rows(out: Path, machine: str, gpu: str, torch: str, triton: str) -> list[list[str]]:
    found = []
    for details in sorted((out / "students").glob("*/details.json")):
        student = details.parent.name
        kind = "reference" if student.startswith("ref") else "slowed 15%"
        for exercise in json.loads(details.read_text())["exercises"]:
            result = exercise["result"]
            for part in result.get("parts", []):
                for row in (part.get("speed") or {}).get("rows", []):
                    if row.get("yardstick") is None:
                        continue
                    found.append([datetime.date.today().isoformat(), gpu, torch, triton, machine,
                                  f"{kind} ({student})", f"{result['exercise']}.{part['name']}", row["label"],
                                  *(f"{row[k]:.3f}" for k in ("yardstick", "yardstick_low", "yardstick_high",
                                                                "ratio", "credit")), str(row.get("rounds") or "")])
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the output folder of `grader grade`")
    parser.add_argument("--machine", required=True, help="which separately started machine graded it")
    parser.add_argument("--gpu", default="H200")
    args = parser.parse_args(argv)
    import torch
    import triton

    found = rows(args.out, args.machine, args.gpu, torch.__version__, triton.__version__)
    if not found:
        print(f"{args.out}: no speed row timed beside the reference", file=sys.stderr)
        return 1
    csv.writer(sys.stdout).writerows(found)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
