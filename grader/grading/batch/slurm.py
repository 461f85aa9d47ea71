"""``grader grade ... --slurm``: a batch as ONE Slurm job array, submitted with ``sbatch`` itself.

* One array task per submission: it grades that student's unfinished exercises one after another
  (``grader grade-task OUT --tasks FILE --index $SLURM_ARRAY_TASK_ID``, the same code as a local batch:
  :func:`grader.grading.commands.grade_task.run_array_task`), committing each exercise as it is judged. A class of a
  few hundred stays far below Slurm's ``MaxArraySize`` (1001 by default; students × exercises would not),
  one allocation and one Triton cache serve all of a student's exercises, and a pre-empted or requeued
  task loses at most the exercise it was running. Tasks are ordered longest work first.
* A dependent job (``afterany``: it runs however the tasks ended) merges the gradebook and the class
  report (``grader grade-task OUT --merge N``).
* The secret is never in a command line, job script or exported environment: tasks read it from
  ``OUT/secret.txt`` (mode 600), and ``sbatch`` runs without ``$GRADER_SECRET`` in its environment.
* Job state lives in OUT, since accounting (``sacct``) may be off: ``staff/slurm/jobs.json`` lists the
  batch's jobs, the tasks' markers and results say the rest, and ``squeue`` is asked only which jobs are
  still queued or running.

Plain ``sbatch`` rather than a library such as submitit: submitit follows jobs through ``sacct`` and pickles
each call's arguments into files, while this needs one small shell script per batch and nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader.grading.batch.scheduler import Task
from grader.grading.config import SlurmSettings
from grader.grading.results import store

JOBS_FILE = "jobs.json"
POLL_S = 2.0
_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
          "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"}


class SlurmError(Exception):
    """Slurm refused or cannot be reached (the message says how)."""


@dataclass(frozen=True)
class Submitted:
    batch: int
    array_job: str
    merge_job: str
    tasks_file: Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Slurm (defaults: the course file's [slurm] table)")
    group.add_argument("--slurm", action="store_true",
                       help="submit the batch as one Slurm job array (one task per submission) and a merge job")
    group.add_argument("--partition", default=None, help="the partition to run in")
    group.add_argument("--gres", default=None, help='generic resources per task, e.g. "gpu:1" (empty: CPU)')
    group.add_argument("--time-limit", default=None, metavar="HH:MM:SS", help="time limit per task")
    group.add_argument("--max-parallel", type=int, default=None, metavar="N", help="array tasks running at once")
    group.add_argument("--cpus-per-task", type=int, default=None, metavar="N")
    group.add_argument("--mem", default=None, help='memory per task, e.g. "32G"')
    group.add_argument("--sbatch-arg", action="append", default=None, metavar="ARG",
                       help="one more sbatch option, e.g. --sbatch-arg=--account=cs336 (repeatable)")
    group.add_argument("--wait", action="store_true", help="wait for the batch to end, then print the grades")


def overrides(args: argparse.Namespace) -> dict[str, Any] | None:
    """The command line's [slurm] overrides, or None for a local batch."""
    if not hasattr(args, "slurm"):
        return None
    given = {"partition": args.partition, "gres": args.gres, "time_limit": args.time_limit,
             "max_parallel": args.max_parallel, "cpus_per_task": args.cpus_per_task, "mem": args.mem,
             "extra_args": args.sbatch_arg}
    if not args.slurm:
        flags = {"extra_args": "--sbatch-arg"}
        named = [flags.get(k, f"--{k.replace('_', '-')}") for k, v in given.items() if v is not None]
        named += ["--wait"] if args.wait else []
        if named:
            raise SlurmError(f"{', '.join(named)} only apply with --slurm")
        return None
    return given


def _folder(out: Path) -> Path:
    return out / store.SLURM


def batch_jobs(out: Path) -> list[dict[str, Any]]:
    path = _folder(out) / JOBS_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def _script(path: Path, command: list[str], what: str, tail: str = "") -> None:
    text = (f"#!/bin/bash\n# {what} (written by grader/grading/batch/slurm.py)\n"
            f"exec {' '.join(shlex.quote(c) for c in command)}{tail}\n")
    store.write_atomic(path, text, mode=0o755)


def _sbatch(argv: list[str], secret: str) -> str:
    """Run sbatch without the secret anywhere in its environment; the job id."""
    if len(secret) >= 8:  # a short test secret would match unrelated variables
        env = {k: v for k, v in os.environ.items() if k != "GRADER_SECRET" and secret not in v}
    else:
        env = {k: v for k, v in os.environ.items() if k != "GRADER_SECRET" and v != secret}
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"sbatch could not be run: {exc}") from None
    if done.returncode != 0:
        raise SlurmError(f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}")
    job = done.stdout.strip().split(";")[0]
    if not job.isdigit():
        raise SlurmError(f"sbatch answered {done.stdout.strip()!r} (expected a job id)")
    return job


def submit(out: Path, tasks: Iterable[Task], *, settings: SlurmSettings, secret: str) -> Submitted:
    """Submit ``tasks`` as one array (a task per student, longest work first) and the merge job."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise SlurmError("sbatch is not installed here: submit from a Slurm login node")
    out = out.resolve()
    folder, logs = _folder(out), _folder(out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    students: dict[str, dict[str, Any]] = {}
    for task in tasks:
        entry = students.setdefault(task.student, {"student": task.student, "source": str(task.submission.source),
                                                   "exercises": [], "estimate_s": 0.0})
        entry["exercises"].append(task.exercise.name)
        entry["estimate_s"] += task.estimate_s
    entries = sorted(students.values(), key=lambda e: (-e["estimate_s"], e["student"]))
    number = 1 + max((int(m.group(1)) for p in folder.glob("batch-*.json")
                      if (m := re.fullmatch(r"batch-(\d+)\.json", p.name))), default=0)
    tasks_file = folder / f"batch-{number}.json"
    store.write_atomic(tasks_file, json.dumps({"students": entries}, indent=1) + "\n")
    grader = [sys.executable, "-P", "-m", "grader.cli", "grade-task", str(out)]
    task_script, merge_script = folder / f"batch-{number}.sh", folder / f"merge-{number}.sh"
    _script(task_script, [*grader, "--tasks", str(tasks_file), "--index"], "one array task: one submission",
            ' "$SLURM_ARRAY_TASK_ID"')
    _script(merge_script, [*grader, "--merge", str(number)], "the gradebook and the class report")
    common = [f"--job-name=grader-{out.name}", f"--chdir={out}", f"--time={settings.time_limit}"]
    common += [f"--partition={settings.partition}"] if settings.partition else []
    common += list(settings.extra_args)
    array = f"0-{len(entries) - 1}" + (f"%{settings.max_parallel}" if settings.max_parallel else "")
    array_argv = [sbatch, "--parsable", *common, f"--array={array}", f"--output={logs}/%A_%a.log",
                  f"--cpus-per-task={settings.cpus_per_task}"]
    array_argv += [f"--gres={settings.gres}"] if settings.gres else []
    array_argv += [f"--mem={settings.mem}"] if settings.mem else []
    array_job = _sbatch([*array_argv, str(task_script)], secret)
    merge_argv = [sbatch, "--parsable", *common, f"--dependency=afterany:{array_job}", "--kill-on-invalid-dep=no",
                  f"--output={logs}/merge-%j.log", "--cpus-per-task=1", str(merge_script)]
    try:
        merge_job = _sbatch(merge_argv, secret)
    except SlurmError:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):  # no batch without its merge job
            subprocess.run(["scancel", array_job], capture_output=True, timeout=60)
        raise
    jobs = batch_jobs(out)
    jobs.append({"batch": number, "array_job": array_job, "merge_job": merge_job, "tasks": len(entries),
                 "tasks_file": str(tasks_file), "submitted": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "sbatch": [[*array_argv, str(task_script)], merge_argv]})
    store.write_atomic(folder / JOBS_FILE, json.dumps(jobs, indent=1) + "\n")
    return Submitted(number, array_job, merge_job, tasks_file)


def active_jobs(job_ids: Iterable[str]) -> set[str] | None:
    """The jobs (``123``) and array tasks (``123_4``) among ``job_ids``' jobs that are still queued or
    running; None where squeue cannot answer."""
    ids = sorted({str(j).split("_")[0] for j in job_ids})
    if not ids:
        return set()
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    try:
        done = subprocess.run([squeue, "-h", "-r", "-j", ",".join(ids), "-o", "%i %T"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return set() if "Invalid job id" in done.stderr else None
    active = set()
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] not in _ENDED:
            active.add(fields[0])
            active.add(fields[0].split("_")[0])
    return active


def active_batch_jobs(out: Path) -> set[str] | None:
    """This folder's Slurm jobs still queued or running (None: squeue cannot answer). A merge job that has
    merged is done, even while Slurm still lists it as completing."""
    jobs = [e for e in batch_jobs(out) if not _merged(out, e["batch"]).exists()]
    active = active_jobs([j for entry in jobs for j in (entry["array_job"], entry["merge_job"])])
    if active is None:
        return None
    return {j for j in active if j.split("_")[0] in {e["array_job"] for e in jobs} | {e["merge_job"] for e in jobs}}


def _merged(out: Path, batch: int) -> Path:
    return _folder(out) / f"merged-{batch}.json"


def task_of_student(out: Path) -> dict[str, tuple[str, Path]]:
    """Each student's latest array task (``123_4``) and its log file."""
    found = {}
    for entry in batch_jobs(out):
        try:
            students = json.loads(Path(entry["tasks_file"]).read_text())["students"]
        except (OSError, ValueError, KeyError):
            continue
        for i, s in enumerate(students):
            job = f"{entry['array_job']}_{i}"
            found[s["student"]] = (job, _folder(out) / "logs" / f"{job}.log")
    return found


def mark_merged(out: Path, batch: int, data: dict[str, Any]) -> None:
    store.write_atomic(_merged(out, batch), json.dumps(data) + "\n")


def wait(out: Path, submitted: Submitted) -> None:
    """Until the merge job has merged; SlurmError if it ended without."""
    marker = _merged(out.resolve(), submitted.batch)
    gone_since = None
    while not marker.exists():
        active = active_jobs([submitted.array_job, submitted.merge_job])
        if active is not None and submitted.merge_job not in active:
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > 10 * POLL_S:
                raise SlurmError(f"the merge job {submitted.merge_job} ended without merging; see "
                                 f"{_folder(out) / 'logs'}/merge-{submitted.merge_job}.log")
        time.sleep(POLL_S)
