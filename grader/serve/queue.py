"""The fair, bounded queue of submissions, kept in the database.

Order: round-robin between students, the student who has waited longest first — a student waits since their
oldest queued submission or since their last grading started, whichever is later — and each student's own
submissions in the order they came. At most one submission per student runs at a time. Bounds: a number of
submissions per student and hour, and of submissions waiting per student (:class:`~grader.serve.policy.Policy`).

A submission is claimed (queued → running) and finished (running → done, with its gradebook entry) in single
transactions; the gradebook entry's key is the submission's id, so it is written exactly once. Whatever was running
when the server stopped is queued again on the next start (:func:`requeue_running`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from grader.serve import audit
from grader.serve.db import Database
from grader.serve.policy import Policy
from grader.serve.records import DONE, FAILED, QUEUED, RUNNING, Grade, SpeedTime, Submission

HOUR_S = 3600.0
MAX_ATTEMPTS = 3  # a submission the grader itself fails on this often is marked failed, not retried forever


class Refused(Exception):
    """A submission the queue does not take; ``status`` is the HTTP status that says why."""

    def __init__(self, message: str, *, status: int, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Waiting:
    """A queued submission, as the ordering sees it."""

    id: int
    student: str
    created: float
    regrade: bool = False  # a regrade after a grader fix: graded after every waiting upload


def order(waiting: Iterable[Waiting], *, last_started: Mapping[str, float], running: Iterable[str] = ()) -> list[int]:
    """The ids of ``waiting`` in the order they will be graded, if nothing else arrives: round-robin between
    students, longest-waiting student first; the regrades the instructor queued after every upload (in the same
    round-robin among themselves). ``last_started``: when each student's last grading started; ``running``: students
    graded now (their next one waits until that grading ends, so they go last in the round)."""
    waiting = list(waiting)
    uploads = [w for w in waiting if not w.regrade]
    regrades = [w for w in waiting if w.regrade]
    if uploads and regrades:
        return (order(uploads, last_started=last_started, running=running)
                + order(regrades, last_started=last_started, running=running))
    per_student: dict[str, list[Waiting]] = {}
    for item in sorted(waiting, key=lambda w: w.id):
        per_student.setdefault(item.student, []).append(item)
    busy = set(running)
    clock = max([*last_started.values(), *(w.created for items in per_student.values() for w in items), 0.0])
    since = {s: (clock + 0.5 if s in busy else max(items[0].created, last_started.get(s, 0.0)))
             for s, items in per_student.items()}
    result = []
    while since:
        student = min(since, key=lambda s: (since[s], per_student[s][0].id))
        result.append(per_student[student].pop(0).id)
        clock += 1.0  # served now: behind everyone who waits
        if per_student[student]:
            since[student] = clock
        else:
            del since[student]
    return result


def enqueue(db: Database, *, student: str, filename: str, kind: str, size: int, exercises: list[str],
            late: list[str], policy: Policy, place: Callable[[int], None] | None = None,
            now: float | None = None) -> int:
    """Queue a submission (already validated); returns its id, or raises Refused. ``place(id)`` stores the upload
    where the worker reads it, inside the transaction: no worker sees the submission before its file is there."""
    now = time.time() if now is None else now
    with db.transaction() as conn:
        check_room(conn, student, policy, now=now)
        cursor = conn.execute(
            "INSERT INTO submissions (student, filename, kind, bytes, exercises, late, created, status) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (student, filename, kind, size, json.dumps(exercises), json.dumps(late), now, QUEUED))
        if place is not None:
            place(int(cursor.lastrowid))
        return int(cursor.lastrowid)


def check_room(conn: sqlite3.Connection, student: str, policy: Policy, *, now: float) -> None:
    """Raise Refused (429, naming the limit) if ``student`` may not queue one more submission now: the hourly limit,
    their waiting submissions, or the whole queue being full. The instructor's regrades count against none of these."""
    recent = conn.execute("SELECT created FROM submissions WHERE student = ? AND created > ? AND regrade_of IS NULL "
                          "ORDER BY created", (student, now - HOUR_S)).fetchall()
    if len(recent) >= policy.submissions_per_hour:
        wait = int(recent[0]["created"] + HOUR_S - now) + 1
        raise Refused(f"at most {policy.submissions_per_hour} submissions an hour: try again in "
                      f"{_minutes(wait)}", status=429, retry_after_s=wait)
    waiting = conn.execute("SELECT COUNT(*) FROM submissions WHERE student = ? AND status = ? AND regrade_of IS NULL",
                           (student, QUEUED)).fetchone()[0]
    if waiting >= policy.queued_per_student:
        raise Refused(f"you have {waiting} submission(s) waiting already (at most {policy.queued_per_student}): "
                      "wait for one to be graded", status=429, retry_after_s=60)
    total = conn.execute("SELECT COUNT(*) FROM submissions WHERE status = ? AND regrade_of IS NULL",
                         (QUEUED,)).fetchone()[0]
    if total >= policy.queued_total:
        raise Refused(f"the queue is full ({total} submissions waiting, at most {policy.queued_total}): try again "
                      "in a few minutes", status=429, retry_after_s=120)


def precheck(db: Database, student: str, policy: Policy, *, now: float | None = None) -> None:
    """:func:`check_room` before an upload is read (enqueue checks again, atomically, once it is)."""
    check_room(db.connection(), student, policy, now=time.time() if now is None else now)


def _minutes(seconds: int) -> str:
    return f"{seconds} s" if seconds < 120 else f"{round(seconds / 60)} min"


def _state(conn) -> tuple[list[Waiting], dict[str, float], set[str]]:
    waiting = [Waiting(r["id"], r["student"], r["queued"] if r["regrade_of"] is not None else r["created"],
                       r["regrade_of"] is not None)
               for r in conn.execute("SELECT id, student, created, queued, regrade_of FROM submissions "
                                     "WHERE status = ?", (QUEUED,))]
    last = {r["student"]: r["t"] for r in conn.execute(
        "SELECT student, MAX(started) AS t FROM submissions WHERE started IS NOT NULL GROUP BY student")}
    running = {r["student"] for r in conn.execute("SELECT student FROM submissions WHERE status = ?", (RUNNING,))}
    return waiting, last, running


def claim_next(db: Database, *, now: float | None = None) -> Submission | None:
    """Take the next submission to grade (queued → running), or None if none may run now."""
    now = time.time() if now is None else now
    with db.transaction() as conn:
        waiting, last, running = _state(conn)
        eligible = [w for w in waiting if w.student not in running]
        if not eligible:
            return None
        chosen = order(eligible, last_started=last)[0]
        conn.execute("UPDATE submissions SET status = ?, started = ?, attempts = attempts + 1 WHERE id = ?",
                     (RUNNING, now, chosen))
        return Submission.from_row(conn.execute("SELECT * FROM submissions WHERE id = ?", (chosen,)).fetchone())


def positions(db: Database) -> dict[int, int]:
    """Each queued submission's 1-based place in the order."""
    conn = db.connection()
    conn.execute("BEGIN")  # one consistent snapshot
    try:
        waiting, last, running = _state(conn)
    finally:
        conn.execute("COMMIT")
    return {sid: i for i, sid in enumerate(order(waiting, last_started=last, running=running), 1)}


def finish(db: Database, submission: Submission, grade: Grade, times: list[SpeedTime], *,
           now: float | None = None) -> bool:
    """Record a graded submission: its status and its gradebook entry, in one transaction. False (and nothing
    written) if this attempt no longer owns it or its entry exists already."""
    now = time.time() if now is None else now
    with db.transaction() as conn:
        row = conn.execute("SELECT status, attempts FROM submissions WHERE id = ?", (submission.id,)).fetchone()
        if row is None or row["status"] != RUNNING or row["attempts"] != submission.attempts:
            return False
        if conn.execute("SELECT 1 FROM gradebook WHERE submission = ?", (submission.id,)).fetchone():
            return False
        conn.execute("INSERT INTO gradebook (submission, student, score, max_score, device, folder, summary, graded) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (submission.id, submission.student, grade.score, grade.max_score, grade.device, grade.folder,
                      grade.summary_json(), now))
        conn.executemany(
            "INSERT INTO speed (submission, student, exercise, part, benchmark, student_ms, ratio, device, measured) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(submission.id, submission.student, t.exercise, t.part, t.benchmark, t.student_ms, t.ratio, t.device, now)
             for t in times])
        conn.execute("UPDATE submissions SET status = ?, finished = ?, message = '' WHERE id = ?",
                     (DONE, now, submission.id))
        if submission.regrade_of is not None:  # the regrade counts from now on; the earlier result is history
            earlier = conn.execute("SELECT score FROM gradebook WHERE submission = ?",
                                   (submission.regrade_of,)).fetchone()
            conn.execute("UPDATE submissions SET superseded_by = ? WHERE id = ?", (submission.id,
                                                                                   submission.regrade_of))
            was = f"{earlier['score']:g}" if earlier else "no grade"
            audit.record(conn, "server", "regrade-done", f"#{submission.regrade_of}",
                         f"superseded by #{submission.id}: {was} -> {grade.score:g}")
    return True


def give_up_or_retry(db: Database, submission: Submission, message: str, *, now: float | None = None) -> str:
    """The grader failed on this attempt: queue it again, or mark it failed after MAX_ATTEMPTS; returns the status."""
    now = time.time() if now is None else now
    status = FAILED if submission.attempts >= MAX_ATTEMPTS else QUEUED
    with db.transaction() as conn:
        conn.execute("UPDATE submissions SET status = ?, finished = ?, message = ? WHERE id = ? AND status = ? "
                     "AND attempts = ?", (status, now if status == FAILED else None, message, submission.id, RUNNING,
                                          submission.attempts))
    return status


def requeue_running(db: Database) -> list[int]:
    """On start: what was running when the server stopped is queued again (graded from scratch)."""
    with db.transaction() as conn:
        ids = [r["id"] for r in conn.execute("SELECT id FROM submissions WHERE status = ?", (RUNNING,))]
        conn.execute("UPDATE submissions SET status = ?, message = ? WHERE status = ?",
                     (QUEUED, "queued again: the server stopped while grading it", RUNNING))
        for submission_id in ids:  # graded again from scratch: a regrade by the server, not by a person
            audit.record(conn, "server", "regrade", f"#{submission_id}", "it was being graded when the server stopped")
    return ids


def get(db: Database, submission_id: int) -> Submission | None:
    rows = db.query("SELECT * FROM submissions WHERE id = ?", (submission_id,))
    return Submission.from_row(rows[0]) if rows else None


def of_student(db: Database, student: str) -> list[Submission]:
    return [Submission.from_row(r) for r in db.query("SELECT * FROM submissions WHERE student = ? ORDER BY id DESC",
                                                     (student,))]


def grade_of(db: Database, submission_id: int) -> Grade | None:
    rows = db.query("SELECT * FROM gradebook WHERE submission = ?", (submission_id,))
    return Grade.from_row(rows[0]) if rows else None


def counts(db: Database) -> dict[str, int]:
    found = {s: 0 for s in (QUEUED, RUNNING, DONE, FAILED)}
    for row in db.query("SELECT status, COUNT(*) AS n FROM submissions GROUP BY status"):
        found[row["status"]] = row["n"]
    return found
