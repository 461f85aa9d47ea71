"""The output folder of a grading run, and the only code that knows its layout::

    OUT/run.json                         the batch's identity and settings (never the secret)
    OUT/secret.txt                       the secret (mode 600): generated when none was given, or for Slurm tasks
    OUT/grades.csv                       the gradebook
    OUT/class-report.html, .csv          the class report
    OUT/staff/grader-errors.log          tracebacks of the grader's own faults
    OUT/staff/running/<id>/<exercise>.json   a task being graded: who runs it (host, pid, Slurm job)
    OUT/staff/gpu-failures/*.json        GPUs taken out of the pool, and why
    OUT/staff/slurm/                     job scripts, task lists, jobs.json and the tasks' logs
    OUT/staff/references/<exercise>/<part>/*.pt   the hidden cases' inputs and references, signed (references.py)
    OUT/students/<id>/                   one folder per student (ids cannot collide with the files above)
        report.md, report.html           the student's report
        results.json                     Gradescope's format
        details.json                     everything, for the instructor
        logs/<exercise>.log              the worker's captured output
        submission.json                  where the submission came from
        state/<exercise>.json            the exercise's typed result: what a regrade or a report is built from

A task is committed when its ``state/<exercise>.json`` exists. Every file is written atomically (a temporary
file in the same folder, then a rename), so an interrupted run leaves whole files only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from grader.grading.results.results import ExerciseResult

RUN_FILE, SECRET_FILE, GRADEBOOK = "run.json", "secret.txt", "grades.csv"
CLASS_REPORT_HTML, CLASS_REPORT_CSV = "class-report.html", "class-report.csv"
STUDENTS, STAFF = "students", "staff"
RUNNING, GPU_FAILURES, SLURM = f"{STAFF}/running", f"{STAFF}/gpu-failures", f"{STAFF}/slurm"
REFERENCES = f"{STAFF}/references"


def write_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_temporary_files(out: Path) -> int:
    """Remove what a writer killed between its temporary file and the rename left behind."""
    found = [p for p in out.rglob(".*.tmp") if p.is_file()] if out.is_dir() else []
    for path in found:
        with contextlib.suppress(OSError):
            path.unlink()
    return len(found)


def student_dir(out: Path, student: str) -> Path:
    return out / STUDENTS / student


def save_exercise(out: Path, student: str, result: ExerciseResult) -> None:
    write_atomic(student_dir(out, student) / "state" / f"{result.exercise}.json",
                 json.dumps(result.to_dict(), indent=1, default=str) + "\n")


def load_exercises(out: Path, student: str) -> dict[str, ExerciseResult]:
    folder = student_dir(out, student) / "state"
    found = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        result = ExerciseResult.from_dict(json.loads(path.read_text()))
        found[result.exercise] = result
    return found


def committed(out: Path, student: str) -> set[str]:
    """The exercises of ``student`` that have a result (without reading them)."""
    folder = student_dir(out, student) / "state"
    return {p.stem for p in folder.glob("*.json")} if folder.is_dir() else set()


def forget_student(out: Path, student: str) -> None:
    """Drop a student's results and reports (their submission changed and is graded again)."""
    shutil.rmtree(student_dir(out, student), ignore_errors=True)
    shutil.rmtree(out / RUNNING / student, ignore_errors=True)


def clear_results(out: Path) -> None:
    """Remove everything a batch wrote into ``out`` except the secret file."""
    for name in (STUDENTS, STAFF):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (RUN_FILE, GRADEBOOK, CLASS_REPORT_HTML, CLASS_REPORT_CSV):
        with contextlib.suppress(FileNotFoundError):
            (out / name).unlink()


def save_submission(out: Path, student: str, data: dict[str, Any]) -> None:
    write_atomic(student_dir(out, student) / "submission.json", json.dumps(data, indent=1) + "\n")


def load_submission(out: Path, student: str) -> dict[str, Any]:
    return json.loads((student_dir(out, student) / "submission.json").read_text())


def students(out: Path) -> list[str]:
    folder = out / STUDENTS
    return sorted(p.name for p in folder.iterdir() if (p / "submission.json").is_file()) if folder.is_dir() else []


def marker_path(out: Path, student: str, exercise: str) -> Path:
    return out / RUNNING / student / f"{exercise}.json"


def write_marker(out: Path, student: str, exercise: str, data: dict[str, Any]) -> None:
    write_atomic(marker_path(out, student, exercise), json.dumps(data, indent=1) + "\n")


def remove_marker(out: Path, student: str, exercise: str) -> None:
    path = marker_path(out, student, exercise)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with contextlib.suppress(OSError):  # not empty: another exercise of the student runs
        path.parent.rmdir()


def read_markers(out: Path) -> list[tuple[str, str, dict[str, Any], float]]:
    """Every marker: (student, exercise, its data, seconds since it was last touched)."""
    found = []
    folder = out / RUNNING
    for path in sorted(folder.glob("*/*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            age = time.time() - path.stat().st_mtime
        except (OSError, ValueError):
            continue  # removed meanwhile
        found.append((path.parent.name, path.stem, data, age))
    return found


def record_gpu_failure(out: Path, data: dict[str, Any]) -> None:
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{data.get('slot', 'gpu').replace(':', '')}.json"
    write_atomic(out / GPU_FAILURES / name, json.dumps(data, indent=1) + "\n")


def gpu_failures(out: Path) -> list[dict[str, Any]]:
    folder = out / GPU_FAILURES
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def write_run(out: Path, data: dict[str, Any]) -> None:
    write_atomic(out / RUN_FILE, json.dumps(data, indent=2) + "\n")


def read_run(out: Path) -> dict[str, Any]:
    return json.loads((out / RUN_FILE).read_text())


def write_secret(out: Path, secret: str) -> None:
    write_atomic(out / SECRET_FILE, secret + "\n", mode=0o600)


def read_secret(out: Path) -> str | None:
    path = out / SECRET_FILE
    return path.read_text().strip() if path.is_file() else None


def log_grader_errors(out: Path, student: str, result: ExerciseResult) -> None:
    """Append the exercise's grader faults, with their tracebacks, to the staff log."""
    errors = result.all_grader_errors()
    if not errors:
        return
    path = out / STAFF / "grader-errors.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(path, "a", encoding="utf-8") as f:
        for error in errors:
            f.write(f"=== {stamp} {student} {result.exercise} {error.where}: {error.error}\n{error.traceback}\n")
