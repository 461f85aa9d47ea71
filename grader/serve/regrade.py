"""Regrades after a grader fix (``grader serve regrade``): the selected stored submissions are queued to be graded
again, each as a submission of its own — the same upload (a hard link, or a copy), the same hand-in time and late
exercises — graded after every waiting upload, never counted against a student's limits. The earlier result stays
as history; once the regrade is graded, the earlier submission is marked superseded (``superseded_by``) and the
regrade's result counts instead (:func:`grader.serve.queue.finish`). Each regrade is in the audit log, with its
reason."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader.serve import audit, storage
from grader.serve.db import Database
from grader.serve.records import DONE, FAILED, QUEUED, RUNNING, Submission


class RegradeError(ValueError):
    """A regrade that cannot be asked for (told verbatim)."""


@dataclass
class Queued:
    regrades: dict[int, int] = field(default_factory=dict)  # earlier submission -> its regrade
    skipped: dict[int, str] = field(default_factory=dict)  # submission -> why it is not regraded


def select(db: Database, *, everything: bool = False, students: tuple[str, ...] = (), exercises: tuple[str, ...] = (),
           submissions: tuple[int, ...] = ()) -> list[Submission]:
    """The stored submissions a selection names (any of ``students``, ``exercises`` — holding that exercise —,
    ``submissions``; ``everything``: all), of students on the roster, those superseded by a graded regrade left out
    (their regrade stands for them)."""
    if not (everything or students or exercises or submissions):
        raise RegradeError("say what to regrade: --all, --student S, --exercise E or --submission ID")
    on_roster = {r["id"] for r in db.query("SELECT id FROM students WHERE removed IS NULL")}
    for student in students:
        if student not in on_roster:
            raise RegradeError(f"{student} is not on the roster")
    rows = db.query("SELECT * FROM submissions ORDER BY id")
    known = {r["id"] for r in rows}
    missing = [i for i in submissions if i not in known]
    if missing:
        raise RegradeError(f"no submission {', '.join(f'#{i}' for i in missing)}")
    gone = [f"#{r['id']} ({r['student']})" for r in rows if r["id"] in submissions and r["student"] not in on_roster]
    if gone:
        raise RegradeError(f"{', '.join(gone)}: removed from the roster, not graded")
    found = []
    for row in rows:
        sub = Submission.from_row(row)
        if sub.student not in on_roster:
            continue
        if sub.id in submissions:
            found.append(sub)  # named by its id: always considered (a superseded one is told why it is skipped)
        elif sub.superseded_by is None and (everything or sub.student in students
                                            or any(e in sub.exercises for e in exercises)):
            found.append(sub)
    return found


def queue_regrades(db: Database, folder: Path, chosen: list[Submission], reason: str, *, actor: str = audit.CLI,
                   now: float | None = None) -> Queued:
    """Queue a regrade of each of ``chosen`` that has a result to replace; what is skipped is told why."""
    reason = reason.strip()
    if not reason:
        raise RegradeError("a regrade needs a reason (--reason): it is kept in the audit log")
    now = time.time() if now is None else now
    done = Queued()
    for sub in chosen:
        with db.transaction() as conn:
            row = conn.execute("SELECT * FROM submissions WHERE id = ?", (sub.id,)).fetchone()
            current = Submission.from_row(row)
            pending = conn.execute("SELECT id FROM submissions WHERE regrade_of = ? AND status IN (?, ?)",
                                   (sub.id, QUEUED, RUNNING)).fetchone()
            if current.superseded_by is not None:
                done.skipped[sub.id] = f"superseded by #{current.superseded_by} (regrade that one)"
                continue
            if current.status in (QUEUED, RUNNING):
                done.skipped[sub.id] = f"{current.status}: it will be graded by the grader as it is now"
                continue
            if pending is not None:
                done.skipped[sub.id] = f"its regrade #{pending['id']} is waiting already"
                continue
            assert current.status in (DONE, FAILED)
            cursor = conn.execute(
                "INSERT INTO submissions (student, filename, kind, bytes, exercises, late, created, status, "
                "regrade_of, queued, message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row["student"], row["filename"], row["kind"], row["bytes"], row["exercises"], row["late"],
                 row["created"], QUEUED, sub.id, now, f"regrade of #{sub.id}"))
            new_id = int(cursor.lastrowid)
            _place(folder, current, new_id)
            audit.record(conn, actor, "regrade", f"#{sub.id}", f"queued as #{new_id} ({current.student}): {reason}",
                         now=now)
            done.regrades[sub.id] = new_id
    return done


def _place(folder: Path, earlier: Submission, new_id: int) -> None:
    """The earlier submission's upload, where the worker reads the regrade's (a hard link: no second copy)."""
    source = storage.upload_path(folder, earlier)
    if not source.is_file():
        raise RegradeError(f"the upload of #{earlier.id} is missing ({source}): it cannot be graded again")
    target = storage.submission_dir(folder, new_id) / "upload" / source.name
    shutil.rmtree(target.parent.parent, ignore_errors=True)  # an id reused after a rolled-back transaction
    storage.make_private_dir(target.parent)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
    with contextlib.suppress(OSError):
        os.chmod(target, storage.FILE_MODE)
