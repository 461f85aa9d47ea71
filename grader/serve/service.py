"""What the server's routes share (:class:`Service`), and who may see a submission (:func:`visible`): a student
only their own, the instructor all; a submission as its pages show it (:func:`detailed`: its place in the queue,
the exercises it counts for, its grade, its progress while it runs).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request

from grader.checks.spec import Exercise
from grader.grading.config import Course
from grader.serve import gradebook, outcome, queue, storage
from grader.serve.backend import Backend
from grader.serve.db import Database
from grader.serve.grading_threads import Pool
from grader.serve.policy import Policy
from grader.serve.records import RUNNING, Principal, Submission


@dataclass
class Service:
    """Everything the routes share."""

    db: Database
    folder: Path
    backend: Backend
    policy: Policy
    course: Course
    all_exercises: tuple[Exercise, ...]
    selected: tuple[Exercise, ...]  # the exercises this server grades
    device: str  # where submissions are graded, in words
    on_gpu: bool
    salt: str  # anonymous leaderboard ids, and the key that signs the messages a redirect carries
    workers: int = 1
    pool: Pool | None = field(default=None, init=False)
    class_lock: threading.Lock = field(default_factory=threading.Lock, init=False)  # one class report build at a time
    uploads_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    uploading: set[str] = field(default_factory=set, init=False)  # students whose upload is being received now


def visible(request: Request, who: Principal, submission_id: int) -> Submission:
    """The submission, if ``who`` may see it: 404 if there is none, 403 if it is someone else's."""
    service: Service = request.app.state.service
    sub = queue.get(service.db, submission_id)
    if sub is None:
        raise HTTPException(404, f"no submission #{submission_id}")
    if not who.may_see(sub.student):
        raise HTTPException(403, f"submission #{submission_id} is not yours")
    return detailed(service, [sub])[0]


def detailed(service: Service, subs: list[Submission]) -> list[Submission]:
    places = queue.positions(service.db) if any(s.status == queue.QUEUED for s in subs) else {}
    removed = {r["id"] for r in service.db.query("SELECT id FROM students WHERE removed IS NOT NULL")}
    counts_for: dict[int, list[str]] = {}
    if any(s.status == queue.DONE for s in subs):
        for by_exercise in gradebook.counting(service.db, service.policy).values():
            for name, counted in sorted(by_exercise.items()):
                counts_for.setdefault(counted.submission, []).append(name)
    for sub in subs:
        sub.counts_for = counts_for.get(sub.id, [])
        sub.student_removed = sub.student in removed
        sub.position = places.get(sub.id)
        sub.grade = queue.grade_of(service.db, sub.id)
        if sub.status == RUNNING:
            out = storage.submission_dir(service.folder, sub.id) / f"attempt-{sub.attempts}"
            sub.progress = outcome.progress(out, len(sub.exercises))
    return subs
