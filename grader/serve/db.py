"""The server's SQLite database: one file in the serve folder, its schema versioned and migrated forward on open.

Every change of state happens in one short ``BEGIN IMMEDIATE`` transaction (:meth:`Database.transaction`), so a
server killed at any moment leaves the queue and the gradebook consistent. Each thread gets its own connection.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

FILE = "serve.sqlite3"

# Index i holds the SQL that takes the schema from version i to i + 1; never edit a released step, append one.
MIGRATIONS: tuple[str, ...] = (
    # 1: the roster, its tokens (hashes only), the submissions and their queue, the gradebook
    """
    CREATE TABLE students (
        id TEXT PRIMARY KEY,
        display_name TEXT,
        leaderboard INTEGER NOT NULL DEFAULT 0,  -- opted into showing display_name on the leaderboard
        created REAL NOT NULL
    );
    CREATE TABLE tokens (
        hash TEXT PRIMARY KEY,                    -- sha256 of the token: the token itself is never stored
        role TEXT NOT NULL CHECK (role IN ('student', 'instructor')),
        student TEXT REFERENCES students(id),
        created REAL NOT NULL
    );
    CREATE TABLE submissions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        student TEXT NOT NULL REFERENCES students(id),
        filename TEXT NOT NULL,
        kind TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        exercises TEXT NOT NULL,                  -- JSON list: the exercises this submission grades
        late TEXT NOT NULL,                       -- JSON list: those of them handed in after their deadline
        created REAL NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        started REAL,
        finished REAL,
        message TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX submissions_by_status ON submissions(status, student, id);
    CREATE INDEX submissions_by_student ON submissions(student, created);
    CREATE TABLE gradebook (
        submission INTEGER PRIMARY KEY REFERENCES submissions(id),  -- one entry per submission, written once
        student TEXT NOT NULL,
        score REAL NOT NULL,
        max_score REAL NOT NULL,
        device TEXT NOT NULL,
        folder TEXT,                              -- the grading output folder, relative to the submission's
        summary TEXT NOT NULL,                    -- JSON: per exercise score, maximum and status
        graded REAL NOT NULL
    );
    """,
    # 2: the web page's sessions and the leaderboard's times
    """
    CREATE TABLE sessions (
        hash TEXT PRIMARY KEY,                    -- sha256 of the cookie's value
        token TEXT NOT NULL REFERENCES tokens(hash) ON DELETE CASCADE,
        expires REAL NOT NULL
    );
    CREATE TABLE speed (
        submission INTEGER NOT NULL REFERENCES submissions(id),
        student TEXT NOT NULL,
        exercise TEXT NOT NULL,
        part TEXT NOT NULL,
        benchmark TEXT NOT NULL,
        student_ms REAL NOT NULL,
        ratio REAL NOT NULL,                      -- baseline_ms / student_ms, as the grader measured it
        device TEXT NOT NULL,                     -- the GPU's name
        measured REAL NOT NULL,
        PRIMARY KEY (submission, exercise, part, benchmark)
    );
    """,
    # 3: a dropped student stays in the history (their submissions kept) but leaves the roster and the gradebook
    """
    ALTER TABLE students ADD COLUMN removed REAL;  -- when they were removed; NULL: on the roster
    """,
    # 4: the audit log, append-only: the triggers refuse to change or delete an entry
    """
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        actor TEXT NOT NULL,                      -- 'instructor', 'student:<id>', 'cli', or 'anonymous'
        action TEXT NOT NULL,                     -- e.g. login, login-failed, submit, token-reissue, export
        subject TEXT NOT NULL DEFAULT '',         -- what it concerns: a student, a submission
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN
        SELECT RAISE(ABORT, 'the audit log is append-only');
    END;
    CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN
        SELECT RAISE(ABORT, 'the audit log is append-only');
    END;
    """,
    # 5: the instructor's overrides of an exercise's score, each with its reason; the latest per (student, exercise)
    # holds, a NULL score clears it; the rows are the history
    """
    CREATE TABLE overrides (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        student TEXT NOT NULL REFERENCES students(id),
        exercise TEXT NOT NULL,
        score REAL,                               -- NULL: the override is cleared, the graded score holds again
        reason TEXT NOT NULL,
        at REAL NOT NULL,
        actor TEXT NOT NULL
    );
    CREATE INDEX overrides_by_student ON overrides(student, exercise, id);
    """,
    # 6: per-student extensions of an exercise's deadline; the latest per (student, exercise) holds
    """
    CREATE TABLE extensions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        student TEXT NOT NULL REFERENCES students(id),
        exercise TEXT NOT NULL,
        until REAL NOT NULL,                      -- the student's deadline for it (POSIX time)
        reason TEXT NOT NULL,
        at REAL NOT NULL,
        actor TEXT NOT NULL
    );
    """,
    # 7: regrades after a grader fix: a regrade is a submission of its own (the same upload, handed in at the same
    # time), and once it is graded the submission it regrades is superseded (kept as history, no longer counted)
    """
    ALTER TABLE submissions ADD COLUMN regrade_of INTEGER;     -- a regrade: the submission it grades again
    ALTER TABLE submissions ADD COLUMN superseded_by INTEGER;  -- the regrade whose result counts instead of this one
    ALTER TABLE submissions ADD COLUMN queued REAL;            -- when a regrade was queued (an upload: created)
    """,
)
VERSION = len(MIGRATIONS)


class SchemaError(RuntimeError):
    """The database was written by a newer grader (told to the instructor verbatim)."""


def schema_version(conn: sqlite3.Connection) -> int:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the missing migrations, each in its own transaction; returns the version reached."""
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = schema_version(conn)
            if current > VERSION:
                raise SchemaError(f"the database is at schema version {current}; this grader knows up to {VERSION}: "
                                  "use the newer grader that wrote it")
            if current == VERSION:
                conn.execute("COMMIT")
                return current
            for statement in _statements(MIGRATIONS[current]):
                conn.execute(statement)
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (current + 1,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def _statements(script: str) -> list[str]:
    # executescript() would commit on its own; split so that a step and its version bump are one transaction
    found, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            found.append(pending.strip())
            pending = ""
    return [s for s in found if s.strip(" ;\n")]


class Database:
    """The serve folder's database; a connection per thread, transactions that hold the write lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._local = threading.local()
        migrate(self.connection())

    @classmethod
    def in_folder(cls, folder: Path) -> Database:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = folder / FILE
        if not path.exists():
            # SQLite gives its -wal and -shm files the database file's mode: made 0600 here, they are private too
            path.touch(mode=0o600)
            os.chmod(path, 0o600)
        return cls(path)

    def connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
            conn.execute("PRAGMA synchronous=FULL")  # a committed result survives a power cut, not just kill -9
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic change: the write lock is taken at BEGIN, so a read-then-write cannot interleave."""
        conn = self.connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def query(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        return self.connection().execute(sql, params).fetchall()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
