"""A student's upload, from the request's bytes to a queued submission: checked by the grader's own submission
code (:mod:`grader.grading.batch.submission`: zip paths outside the archive, zip bombs, links, file counts and
sizes, malformed notebooks), its exercises found, its deadlines applied, then queued."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading.batch import submission
from grader.serve import extensions, queue, storage
from grader.serve.db import Database
from grader.serve.policy import Policy
from grader.serve.records import Submission

MAX_UPLOAD_BYTES = submission.MAX_BYTES  # the same limit as grader grade's, on the upload itself
KINDS = {".zip": "zip", ".ipynb": "notebook"}


@dataclass(frozen=True)
class Accepted:
    id: int
    exercises: list[str]
    late: list[str]
    problems: list[str]  # what the submission code noted but did not refuse (e.g. a link skipped)


def kind_of(filename: str) -> str:
    kind = KINDS.get(Path(filename).suffix.lower())
    if kind is None:
        raise queue.Refused(f"{filename!r}: hand in a .zip of your assignments/ folder or a .ipynb notebook "
                            "(grader submit zips a folder for you)", status=415)
    return kind


def accept(db: Database, *, folder: Path, student: str, filename: str, data_file: Path, size: int, policy: Policy,
           selected: tuple[Exercise, ...], now: float | None = None) -> Accepted:
    """Check the upload in ``data_file`` and queue it; raises queue.Refused (with an HTTP status) if it is not
    taken."""
    now = time.time() if now is None else now
    kind = kind_of(filename)
    if size > MAX_UPLOAD_BYTES:
        raise queue.Refused(f"the upload is larger than {MAX_UPLOAD_BYTES >> 20} MB", status=413)
    with tempfile.TemporaryDirectory(prefix="grader-serve-check-") as scratch:
        named = Path(scratch) / f"{student}{storage.EXTENSIONS[kind]}"
        shutil.copyfile(data_file, named)
        shown = Path(filename).name or named.name  # the student's own file name, not the stored one

        def told(text: str) -> str:
            return text.replace(str(named), shown).replace(named.name, shown)

        try:
            sub = submission.prepare(named, Path(scratch) / "prepared", selected)
        except submission.SubmissionError as exc:
            raise queue.Refused(told(str(exc)), status=422) from None
        sub.problems = [told(p) for p in sub.problems]
        if sub.root is None:
            raise queue.Refused("; ".join(sub.problems) or f"{shown} cannot be read", status=422)
        present = [e.name for e in selected if (sub.root / e.name / f"{e.module}.py").is_file()]
    if not present:
        names = ", ".join(f"{e.name}/{e.module}.py" for e in selected)
        raise queue.Refused(f"no exercise module found (expected files like {names})", status=422)
    policy = extensions.policy_for(db, policy, student)  # their own deadlines, where they have an extension
    late = policy.late_exercises(present, at=now)
    if policy.late == "refuse":
        present = [e for e in present if e not in late]
        if not present:
            raise queue.Refused(f"the deadline of {', '.join(late)} has passed: late submissions are not accepted",
                                status=403)
        late = []

    def place(submission_id: int) -> None:
        target = storage.upload_path(folder, Submission(submission_id, student, filename, kind, size, [], [], now,
                                                        queue.QUEUED, 0, None, None, ""))
        shutil.rmtree(target.parent.parent, ignore_errors=True)  # an id reused after a rolled-back transaction
        storage.make_private_dir(target.parent)
        shutil.copyfile(data_file, target)
        os.chmod(target, storage.FILE_MODE)

    submission_id = queue.enqueue(db, student=student, filename=Path(filename).name[:200], kind=kind, size=size,
                                  exercises=present, late=late, policy=policy, place=place, now=now)
    return Accepted(submission_id, present, late, list(sub.problems))
