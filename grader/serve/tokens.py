"""The roster and its tokens. A token is ``gt_`` and 32 random bytes (URL-safe text), shown once, when it is made; the
database keeps its sha256 only, so a copy of the database lets nobody log in. Sessions of the web page work the same
way."""

from __future__ import annotations

import csv
import hashlib
import secrets
import sqlite3
import time
from pathlib import Path

from grader.grading.batch import submission
from grader.serve import audit
from grader.serve.db import Database
from grader.serve.records import FAILED, INSTRUCTOR, QUEUED, STUDENT, Principal, Student

SESSION_S = 7 * 24 * 3600  # a web login lasts a week


class RosterError(ValueError):
    """A roster change that cannot be made (told verbatim)."""


TOKEN_PREFIX = "gt_"  # never a leading "-", which a command line would read as an option ("--token -x...")


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


def student_id(name: str) -> str:
    """A roster id: the same folder-safe form the grader gives student ids."""
    cleaned = submission.sanitize(name)
    if cleaned != name.strip():
        raise RosterError(f"{name!r} is not a plain student id: use letters, digits, '.', '_' and '-' "
                          f"(for example {cleaned!r})")
    return cleaned


def add_student(db: Database, student: str, *, display_name: str | None = None, actor: str = audit.CLI) -> str:
    """Add ``student`` to the roster; returns their token (the only time it exists in clear)."""
    student = student_id(student)
    token = new_token()
    now = time.time()
    try:
        with db.transaction() as conn:
            conn.execute("INSERT INTO students (id, display_name, created) VALUES (?, ?, ?)",
                         (student, submission.display_name(display_name), now))
            conn.execute("INSERT INTO tokens (hash, role, student, created) VALUES (?, ?, ?, ?)",
                         (token_hash(token), STUDENT, student, now))
            audit.record(conn, actor, "student-add", student)
    except sqlite3.IntegrityError:
        removed = db.query("SELECT 1 FROM students WHERE id = ? AND removed IS NOT NULL", (student,))
        if removed:
            raise RosterError(f"{student} was removed from the roster; their id is kept with their submissions' "
                              "history: add them under another id") from None
        raise RosterError(f"{student} is on the roster already") from None
    return token


def _on_roster(conn: sqlite3.Connection, student: str) -> str:
    """``student``'s id if they are on the roster now; a RosterError that says why not otherwise."""
    student = student_id(student)
    row = conn.execute("SELECT removed FROM students WHERE id = ?", (student,)).fetchone()
    if row is None:
        raise RosterError(f"{student} is not on the roster (grader serve roster list shows who is)")
    if row["removed"] is not None:
        raise RosterError(f"{student} was removed from the roster")
    return student


def _revoke(conn: sqlite3.Connection, student: str) -> int:
    # their web sessions go with the tokens (ON DELETE CASCADE): a logged-in browser is logged out at once
    return conn.execute("DELETE FROM tokens WHERE role = ? AND student = ?", (STUDENT, student)).rowcount


def reissue(db: Database, student: str, *, actor: str = audit.CLI) -> str:
    """A new token for ``student``; every earlier one (and every session opened with it) stops working now."""
    token = new_token()
    with db.transaction() as conn:
        student = _on_roster(conn, student)
        revoked = _revoke(conn, student)
        conn.execute("INSERT INTO tokens (hash, role, student, created) VALUES (?, ?, ?, ?)",
                     (token_hash(token), STUDENT, student, time.time()))
        audit.record(conn, actor, "token-reissue", student, f"{revoked} earlier token(s) revoked")
    return token


def revoke(db: Database, student: str, *, actor: str = audit.CLI) -> int:
    """Revoke ``student``'s tokens (no new one: reissue gives them one again); returns how many were revoked."""
    with db.transaction() as conn:
        student = _on_roster(conn, student)
        revoked = _revoke(conn, student)
        audit.record(conn, actor, "token-revoke", student, f"{revoked} token(s) revoked")
    return revoked


def remove_student(db: Database, student: str, *, actor: str = audit.CLI) -> int:
    """Drop ``student`` from the roster: their tokens are revoked, their submissions stay as history (marked removed,
    out of the gradebook), those still queued are not graded. Returns how many queued submissions were cancelled."""
    now = time.time()
    with db.transaction() as conn:
        student = _on_roster(conn, student)
        _revoke(conn, student)
        conn.execute("UPDATE students SET removed = ? WHERE id = ?", (now, student))
        cancelled = conn.execute(
            "UPDATE submissions SET status = ?, finished = ?, message = ? WHERE student = ? AND status = ?",
            (FAILED, now, "not graded: the student was removed from the roster", student, QUEUED)).rowcount
        audit.record(conn, actor, "student-remove", student, f"{cancelled} queued submission(s) cancelled")
    return cancelled


def rotate_instructor(db: Database, *, actor: str = audit.CLI) -> str:
    """A new instructor token; every earlier one (and its sessions) stops working now."""
    token = new_token()
    with db.transaction() as conn:
        revoked = conn.execute("DELETE FROM tokens WHERE role = ?", (INSTRUCTOR,)).rowcount
        conn.execute("INSERT INTO tokens (hash, role, student, created) VALUES (?, ?, NULL, ?)",
                     (token_hash(token), INSTRUCTOR, time.time()))
        audit.record(conn, actor, "instructor-token-rotate", "", f"{revoked} earlier token(s) revoked")
    return token


def import_roster(db: Database, path: Path) -> list[tuple[str, str]]:
    """Add every student of a CSV (a ``student`` or ``id`` column, optionally ``name``) not on the roster yet;
    returns (student, token) for each one added."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    if rows and not ({"student", "id"} & set(rows[0])):
        raise RosterError(f"{path}: needs a 'student' (or 'id') column; it has {', '.join(rows[0])}")
    known = {s.id for s in students(db, removed=True)}
    added = []
    for row in rows:
        name = (row.get("student") or row.get("id") or "").strip()
        if not name or student_id(name) in known:
            continue
        added.append((student_id(name), add_student(db, name, display_name=(row.get("name") or "").strip() or None)))
        known.add(added[-1][0])
    return added


def instructor_token(db: Database) -> str:
    """A new instructor token (earlier ones stay valid; :func:`rotate_instructor` revokes them)."""
    token = new_token()
    with db.transaction() as conn:
        conn.execute("INSERT INTO tokens (hash, role, student, created) VALUES (?, ?, NULL, ?)",
                     (token_hash(token), INSTRUCTOR, time.time()))
        audit.record(conn, audit.CLI, "instructor-token-add")
    return token


def has_instructor(db: Database) -> bool:
    return bool(db.query("SELECT 1 FROM tokens WHERE role = ? LIMIT 1", (INSTRUCTOR,)))


def students(db: Database, *, removed: bool = False) -> list[Student]:
    """The students on the roster (with ``removed``, also those removed from it)."""
    where = "" if removed else "WHERE removed IS NULL"
    return [Student.from_row(r) for r in db.query(f"SELECT * FROM students {where} ORDER BY id")]


def authenticate(db: Database, token: str) -> Principal | None:
    if not token:
        return None
    rows = db.query("SELECT role, student FROM tokens WHERE hash = ?", (token_hash(token),))
    return Principal(rows[0]["role"], rows[0]["student"]) if rows else None


def open_session(db: Database, token: str) -> str | None:
    """A session for the web page (the cookie's value), or None if ``token`` is not valid."""
    if authenticate(db, token) is None:
        return None
    session = new_token()
    now = time.time()
    with db.transaction() as conn:
        conn.execute("DELETE FROM sessions WHERE expires < ?", (now,))
        conn.execute("INSERT INTO sessions (hash, token, expires) VALUES (?, ?, ?)",
                     (token_hash(session), token_hash(token), now + SESSION_S))
    return session


def session_principal(db: Database, session: str) -> Principal | None:
    if not session:
        return None
    rows = db.query("SELECT t.role, t.student FROM sessions s JOIN tokens t ON t.hash = s.token "
                    "WHERE s.hash = ? AND s.expires >= ?", (token_hash(session), time.time()))
    return Principal(rows[0]["role"], rows[0]["student"]) if rows else None


def close_session(db: Database, session: str) -> None:
    with db.transaction() as conn:
        conn.execute("DELETE FROM sessions WHERE hash = ?", (token_hash(session),))
