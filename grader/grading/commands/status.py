"""``grader status OUT``: where a batch stands, per student and exercise, from what the folder holds
(:mod:`grader.grading.results.store`) and, for a Slurm batch, which of its jobs ``squeue`` still lists:

* **done** — a result is committed (with its score);
* **unreadable** — committed, but the submission could not be read (a broken zip or notebook): nothing was graded;
* **needs regrade** — committed, but the grader failed on some part (``grader grade --regrade-errors OUT``);
* **running** — a live marker: the process (or Slurm task) grading it is still there;
* **failed** — started but died without a result: a stale marker, or a Slurm task that has left the queue;
* **queued** — its Slurm array task has not started yet;
* **missing** — never started.

Submissions of which nothing could be graded (unreadable, or no exercise module) are named with the reason.

Running the same ``grader grade`` command again grades everything but "done" (and "running", which it
refuses to grade twice).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grader.grading.batch import markers, slurm
from grader.grading.results import store
from grader.grading.results.results import ERROR, UNREADABLE, ungradable

STATES = ("done", "unreadable", "needs regrade", "running", "failed", "queued", "missing")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", help="a grading run's output folder")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def collect(out: Path) -> dict[str, Any]:
    """``{"students": {student: {exercise: {"state", "detail"}}}, "counts": {state: n}, "exercises": [...]}``"""
    run = store.read_run(out)
    names = list(run.get("exercises", []))
    active = slurm.active_batch_jobs(out)
    live = {}
    for student, exercise, data, age in store.read_markers(out):
        live[(student, exercise)] = markers.liveness(data, age, active)
    tasks = slurm.task_of_student(out)
    table: dict[str, dict[str, dict[str, str]]] = {}
    for student in store.students(out):
        results = store.load_exercises(out, student)
        row = table[student] = {}
        for name in names:
            result = results.get(name)
            life = live.get((student, name))
            job, log = tasks.get(student, (None, None))
            if result is not None and result.status == ERROR and result.message.startswith(UNREADABLE):
                state, detail = "unreadable", result.message.removeprefix(UNREADABLE)  # not graded: never "done"
            elif result is not None and not result.needs_regrade:
                state, detail = "done", result.status
            elif life is not None and life.alive:
                state, detail = "running", life.why
            elif result is not None:
                state, detail = "needs regrade", ", ".join(result.regrade_parts())
            elif life is not None:
                state, detail = "failed", life.why
            elif job and active is not None and job in active:
                state, detail = "queued", f"Slurm task {job}"
            elif job and log is not None and log.exists():
                state, detail = "failed", f"Slurm task {job} ended without a result (log: {log})"
            else:
                state, detail = "missing", ""
            row[name] = {"state": state, "detail": detail}
    counts = {s: sum(cell["state"] == s for row in table.values() for cell in row.values()) for s in STATES}
    return {"exercises": names, "students": table, "counts": counts,
            "slurm": None if active is None else sorted(active), "ungradable": _ungradable(out, names)}


def _ungradable(out: Path, names: list[str]) -> dict[str, str]:
    """student -> why nothing of their submission was graded, for those graded whole."""
    found = {}
    for student in store.students(out):
        results = store.load_exercises(out, student)
        if set(results) >= set(names):
            reason = ungradable(store.load_submission(out, student).get("problems", []),
                                [results[n] for n in names])
            if reason:
                found[student] = reason
    return found


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        status = collect(out)
    except (OSError, ValueError):
        print(f"grader status: {out}: no grading run here (no readable {store.RUN_FILE})", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(status, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    style = {"done": "green", "unreadable": "red", "needs regrade": "blue", "running": "cyan", "failed": "red",
             "queued": "yellow", "missing": "white"}
    table = Table(title=f"grader status {out}")
    table.add_column("student")
    for name in status["exercises"]:
        table.add_column(name)
    for student, row in status["students"].items():
        table.add_row(student, *(f"[{style[c['state']]}]{c['state']}[/]" for c in row.values()))
    console = Console()
    console.print(table)
    counts = status["counts"]
    console.print(", ".join(f"{n} {s}" for s, n in counts.items() if n) or "nothing to grade")
    for student, row in status["students"].items():
        for name, cell in row.items():
            if cell["state"] in ("running", "failed", "needs regrade") and cell["detail"]:
                console.print(f"  {student}/{name}: {cell['state']}: {cell['detail']}", highlight=False)
    for student, reason in status["ungradable"].items():
        console.print(f"  {student}: nothing could be graded: {reason}", highlight=False, markup=False)
    if counts["failed"] or counts["missing"] or counts["needs regrade"]:
        console.print("Run the same `grader grade` command again to grade what is missing, failed or needs a "
                      "regrade.")
    return 0
