"""Backup and restore of a serve folder: ``grader serve backup`` while the server runs (SQLite's online backup: a
committed snapshot, never a half-written transaction) plus the uploads and reports, then ``grader serve restore``
into a new folder — the roster, tokens, submissions, grades, uploads and audit log come back, private."""

from __future__ import annotations

import json
import sqlite3

from grader import cli
from grader.serve import audit, backup, queue, storage
from grader.serve import db as db_mod
from grader.serve.backend import Job

from . import serve_helpers as helpers


def _serve(capsys, *args: str) -> tuple[int, str, str]:
    status = cli.main(["serve", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_backup_taken_while_the_server_runs_restores_into_a_working_folder(tmp_path, capsys):
    folder, saved, restored = tmp_path / "serve-dir", tmp_path / "backup", tmp_path / "restored"
    found = helpers.add_students(folder, "alice", "bob")
    secret = storage.secret(folder)
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), start_workers=False) as server:
        db = server.service.db
        for student in ("alice", "bob"):
            status, data = helpers.upload(server.url, found[student], helpers.gelu_zip(tmp_path / f"{student}.zip"))
            assert status == 201, data
        graded = queue.claim_next(db)
        grade, times = server.service.backend.grade(Job(graded, tmp_path / "alice.zip", tmp_path))
        assert queue.finish(db, graded, grade, times)
        (folder / "submissions" / str(graded.id) / "attempt-1.log").write_text("the grader's output\n")

        status, _, err = _serve(capsys, "backup", "--dir", str(folder), "--out", str(saved))
        assert status == 0 and "2 student(s) and 2 submission(s)" in err, err
        assert helpers.upload(server.url, found["bob"], tmp_path / "bob.zip")[0] == 201  # after the backup

    status, _, err = _serve(capsys, "restore", "--from", str(saved), "--dir", str(restored))
    assert status == 0, err
    assert helpers.rows(restored, "SELECT id, student, status FROM submissions ORDER BY id") == [
        (1, "alice", "done"), (2, "bob", "queued")]  # the third came after the backup
    assert helpers.rows(restored, "SELECT submission, score FROM gradebook") == [(graded.id, 1.0)]
    upload = restored / "submissions" / "1" / "upload" / "alice.zip"
    assert upload.read_bytes() == (tmp_path / "alice.zip").read_bytes()
    assert (restored / "submissions" / "1" / "attempt-1.log").read_text() == "the grader's output\n"
    assert (restored / "secret.txt").read_text() == f"{secret}\n"  # the hidden cases stay the same
    # the live server's log records the backup; the restored one, its restore
    assert [e.subject for e in audit.entries(db_mod.Database.in_folder(folder), action="backup")] == [str(saved)]
    assert [e.action for e in audit.entries(db_mod.Database(restored / db_mod.FILE))][-2:] == ["submit", "restore"]
    assert json.loads((saved / "backup.json").read_text())["submissions"] == 2
    for path in [saved, restored, *saved.rglob("*"), *restored.rglob("*")]:
        assert not path.lstat().st_mode & 0o077, path

    # the restored folder serves: the students' tokens work, and they see their submissions
    with helpers.in_process_server(restored, helpers.SleepingStandInBackend(), start_workers=False) as server:
        status, body = helpers.http(server.url + "/api/submissions", token=found["alice"])
        assert status == 200 and [s["id"] for s in json.loads(body)["submissions"]] == [1]


def test_the_backup_is_a_committed_snapshot_and_restore_never_overwrites(tmp_path, capsys):
    folder, saved = tmp_path / "serve-dir", tmp_path / "backup"
    helpers.add_students(folder, "alice")
    database = db_mod.Database.in_folder(folder)  # the server's, open before the write below starts
    writer = sqlite3.connect(folder / db_mod.FILE, isolation_level=None, timeout=30)
    writer.execute("BEGIN IMMEDIATE")  # a transaction in progress while the backup runs
    writer.execute("INSERT INTO students (id, created) VALUES ('half-written', 0)")
    manifest = backup.backup(database, folder, saved, log=False)
    writer.execute("COMMIT")
    writer.close()
    assert manifest["students"] == 1
    assert helpers.rows(saved, "SELECT id FROM students") == [("alice",)]

    status, _, err = _serve(capsys, "restore", "--from", str(saved), "--dir", str(folder))
    assert status == 2 and "is not empty: a restore goes into a new or empty folder" in err
    status, _, err = _serve(capsys, "backup", "--dir", str(folder), "--out", str(saved))
    assert status == 2 and "is not empty: a backup goes into a new or empty folder" in err
    status, _, err = _serve(capsys, "restore", "--from", str(tmp_path), "--dir", str(tmp_path / "new"))
    assert status == 2 and "is not a grader serve backup" in err
