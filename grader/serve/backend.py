"""How a submission is graded: the :class:`Backend` a worker calls. :class:`EngineBackend` grades through the
grading engine (:func:`grader.grading.commands.grade.grade`), in a child process of its own per submission
(:mod:`grader.serve.grade_one`): the engine installs signal handlers and runs its own workers, which needs a main
thread, and a crash of one grading never takes the server down. The child dies with the server (PR_SET_PDEATHSIG),
so a server killed mid-grading leaves nothing running; its submission is graded again on the next start."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from grader import exercises as exercises_mod
from grader.grading import config
from grader.grading.batch import exits
from grader.grading.isolation.parent_death import die_with_parent
from grader.serve import outcome
from grader.serve.records import Grade, SpeedTime, Submission

GRADED_STATUSES = (0, exits.NEEDS_REGRADE, exits.UNGRADABLE)  # grader grade's: all graded (some reported)
NEEDS_REGRADE = exits.NEEDS_REGRADE  # the grader failed on some parts (never the student's fault)
REGRADES = 2  # times such parts are graded again (the same command resumes them) before the grade is recorded


class GradingFailed(RuntimeError):
    """The grader could not grade this attempt (not the student's fault): it is retried."""


@dataclass(frozen=True)
class Job:
    """One attempt at grading one submission."""

    submission: Submission
    upload: Path  # the stored upload: a .zip or a .ipynb named after the student
    folder: Path  # the submission's folder: each attempt grades into a new folder inside it


class Backend(Protocol):
    def grade(self, job: Job) -> tuple[Grade, list[SpeedTime]]: ...


PATH_OPTIONS = ("course", "references", "yardstick_cache")  # GradeOptions fields that hold a folder or file


def options_to_dict(options: config.GradeOptions) -> dict[str, Any]:
    data = {f.name: getattr(options, f.name) for f in fields(options)}
    data.update({name: str(data[name]) if data[name] else None for name in PATH_OPTIONS})
    data["exercises"] = list(options.exercises)
    data["slurm"] = dict(options.slurm) if options.slurm is not None else None
    return data


def options_from_dict(data: dict[str, Any]) -> config.GradeOptions:
    paths = {name: Path(data[name]) if data.get(name) else None for name in PATH_OPTIONS}
    return config.GradeOptions(**{**data, "exercises": tuple(data["exercises"]), **paths})


class EngineBackend:
    """Grades with ``options`` (``grader serve``'s grading options), the serve folder's secret in the child's
    environment (never on its command line)."""

    def __init__(self, *, options: config.GradeOptions, secret: str, course: config.Course) -> None:
        self.options = options
        self.secret = secret
        self.course = course
        self.all_exercises = exercises_mod.all_exercises()

    def command(self, spec: Path) -> list[str]:
        """The child that grades one attempt: ``grader grade`` of the upload into the attempt's folder; run again
        on the same folder, it resumes (grades only what is missing or needs a regrade)."""
        return [sys.executable, "-m", "grader.serve.grade_one", str(spec)]

    def grade(self, job: Job) -> tuple[Grade, list[SpeedTime]]:
        name = f"attempt-{job.submission.attempts}"
        out = job.folder / name
        shutil.rmtree(out, ignore_errors=True)  # a previous server's half-written attempt of the same number
        options = self.options.replace(exercises=tuple(job.submission.exercises), secret=None, fresh=False,
                                       wait=True)
        spec = job.folder / f"{name}.json"
        spec.write_text(json.dumps({"upload": str(job.upload), "out": str(out), "options": options_to_dict(options)}))
        env = {**os.environ, "GRADER_SECRET": self.secret, "PYTHONUNBUFFERED": "1"}
        with open(job.folder / f"{name}.log", "wb") as log:
            for _ in range(1 + REGRADES):  # parts the grader failed on are graded again, never charged
                child = subprocess.Popen(self.command(spec), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         preexec_fn=die_with_parent(signal.SIGKILL))
                status = child.wait()
                if status != NEEDS_REGRADE:
                    break
        if status not in GRADED_STATUSES:
            tail = (job.folder / f"{name}.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise GradingFailed(f"the grader exited with status {status}: " + " / ".join(tail))
        try:
            return outcome.read(out, folder=name, course=self.course, all_exercises=self.all_exercises)
        except (outcome.NoResult, OSError, ValueError, KeyError) as exc:
            raise GradingFailed(f"the grader left no readable result: {exc}") from None
