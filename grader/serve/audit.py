"""The audit log: who logged in (or failed to), handed in, changed a token, exported the gradebook — a table of the
database that triggers keep append-only (db.py, migration 4), so it is as private, as durable and as backed up as
the rest of the server's state. Never a token in it: only who, what, and about whom."""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
from dataclasses import asdict, dataclass
from typing import Any

from grader.serve.db import Database
from grader.serve.records import Principal

CLI = "cli"  # an instructor at the server's command line
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Entry:
    id: int
    at: float
    actor: str
    action: str
    subject: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        when = dt.datetime.fromtimestamp(self.at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return "\t".join((when, self.actor, self.action, self.subject, self.detail)).rstrip()


def actor_of(who: Principal | None) -> str:
    if who is None:
        return ANONYMOUS
    return "instructor" if who.is_instructor else f"student:{who.student}"


def record(target: Database | sqlite3.Connection, actor: str, action: str, subject: str = "", detail: str = "",
           *, now: float | None = None) -> None:
    """Append one entry; given a connection inside a transaction, the entry commits (or not) with the change."""
    row = (time.time() if now is None else now, actor, action, subject, detail[:500])
    sql = "INSERT INTO audit (at, actor, action, subject, detail) VALUES (?, ?, ?, ?, ?)"
    if isinstance(target, Database):
        with target.transaction() as conn:
            conn.execute(sql, row)
    else:
        target.execute(sql, row)


def entries(db: Database, *, limit: int | None = None, action: str | None = None) -> list[Entry]:
    """The log, oldest first (the last ``limit`` entries, of ``action`` only if given)."""
    where, params = ("WHERE action = ?", (action,)) if action else ("", ())
    rows = db.query(f"SELECT * FROM audit {where} ORDER BY id DESC LIMIT ?", (*params, -1 if limit is None else limit))
    return [Entry(r["id"], r["at"], r["actor"], r["action"], r["subject"], r["detail"]) for r in reversed(rows)]
