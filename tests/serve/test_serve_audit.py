"""The audit log: logins and failed logins (web and API), submissions and refusals, token operations, the server's
regrades and exports are appended, never a token in them; the log cannot be changed or shortened; the instructor
reads it with ``grader serve log``; schema migrations keep the rows of an earlier version."""

from __future__ import annotations

import json
import sqlite3
import urllib.parse

import pytest

from grader import cli
from grader.serve import audit, queue, tokens
from grader.serve import db as db_mod

from . import serve_helpers as helpers


def _serve(capsys, folder, *args: str) -> tuple[int, str, str]:
    status = cli.main(["serve", *args, "--dir", str(folder)])
    out, err = capsys.readouterr()
    return status, out, err


def _actions(db: db_mod.Database) -> list[tuple[str, str, str]]:
    return [(e.actor, e.action, e.subject) for e in audit.entries(db)]


def test_logins_submissions_token_operations_and_exports_are_logged(tmp_path, capsys):
    folder = tmp_path / "serve-dir"
    status, out, err = _serve(capsys, folder, "roster", "add", "alice")
    assert status == 0, err
    alice = out.strip().split("\t")[1]
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), start_workers=False) as server:
        db = server.service.db
        instructor = tokens.instructor_token(db)
        body = urllib.parse.urlencode({"token": alice}).encode()
        form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": server.url}
        assert helpers.http(server.url + "/login", method="POST", data=body, headers=form)[0] in (200, 303)
        wrong = urllib.parse.urlencode({"token": "gt_wrong"}).encode()
        assert helpers.http(server.url + "/login", method="POST", data=wrong, headers=form)[0] == 401
        assert helpers.http(server.url + "/api/submissions", token="gt_stolen")[0] == 401
        status, data = helpers.upload(server.url, alice, helpers.gelu_zip(tmp_path / "a.zip"))
        assert status == 201, data
        status, data = helpers.upload(server.url, alice, tmp_path / "a.zip")
        assert status == 201, data
        assert helpers.http(server.url + "/instructor/grades.csv", token=instructor)[0] == 200
        assert _serve(capsys, folder, "roster", "reissue", "alice")[0] == 0
        assert _serve(capsys, folder, "roster", "revoke", "alice")[0] == 0
        assert _serve(capsys, folder, "instructor-token", "--rotate")[0] == 0
        running = queue.claim_next(db)
        assert queue.requeue_running(db) == [running.id]  # what `grader serve` does on start
        assert _serve(capsys, folder, "roster", "remove", "alice")[0] == 0

    db = db_mod.Database.in_folder(folder)
    assert _actions(db) == [
        ("cli", "student-add", "alice"),
        ("cli", "instructor-token-add", ""),
        ("student:alice", "login", ""),
        ("anonymous", "login-failed", ""),
        ("anonymous", "login-failed", ""),
        ("student:alice", "submit", "alice"),
        ("student:alice", "submit", "alice"),
        ("instructor", "export", "grades.csv"),
        ("cli", "token-reissue", "alice"),
        ("cli", "token-revoke", "alice"),
        ("cli", "instructor-token-rotate", ""),
        ("server", "regrade", f"#{running.id}"),
        ("cli", "student-remove", "alice"),
    ]
    details = " ".join(e.detail for e in audit.entries(db))
    assert "web login from 127.0.0.1" in details and "API token from 127.0.0.1" in details
    assert alice not in details and "gt_wrong" not in details and "gt_stolen" not in details

    status, out, err = _serve(capsys, folder, "log", "--action", "login-failed")
    assert status == 0, err
    assert [line.split("\t")[1:3] for line in out.splitlines()] == [["anonymous", "login-failed"]] * 2
    status, out, err = _serve(capsys, folder, "log", "--limit", "1", "--json")
    assert [json.loads(line)["action"] for line in out.splitlines()] == ["student-remove"]


def test_the_log_is_append_only(tmp_path):
    db = db_mod.Database.in_folder(tmp_path / "serve-dir")
    audit.record(db, audit.CLI, "export", "out")
    for sql in ("UPDATE audit SET actor = 'someone else'", "DELETE FROM audit"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"), db.transaction() as conn:
            conn.execute(sql)
    assert _actions(db) == [("cli", "export", "out")]


def test_a_version_2_database_migrates_forward_with_its_rows(tmp_path):
    path = tmp_path / db_mod.FILE
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (2)")
    for step in db_mod.MIGRATIONS[:2]:
        for statement in db_mod._statements(step):
            conn.execute(statement)
    conn.execute("INSERT INTO students (id, created) VALUES ('old', 0)")
    conn.close()
    database = db_mod.Database(path)
    assert db_mod.schema_version(database.connection()) == db_mod.VERSION
    assert [(s.id, s.removed) for s in tokens.students(database)] == [("old", False)]
    assert audit.entries(database) == []
