"""The serve folder is the owner's only: after a real ``grader serve`` start and a graded upload, nothing in it
(database, WAL, uploads, reports, logs, secret) has a group or other permission bit; a folder an earlier version
left open is tightened on start, with a note."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from grader import cli
from grader.grading.results import store
from grader.serve import grading_threads, queue, storage
from grader.serve.backend import Job
from grader.serve.records import Grade

from . import serve_helpers as helpers


def _open_paths(folder) -> list[str]:
    return [f"{p} {stat.filemode(p.lstat().st_mode)}" for p in [folder, *folder.rglob("*")]
            if p.lstat().st_mode & 0o077]


@dataclass
class ReportWritingStandIn:
    """A TEST STAND-IN for the grading engine that writes its files as the engine does: reports through the
    results store's writer (which sets mode 0644 itself) and a log."""

    def grade(self, job: Job) -> tuple[Grade, list]:
        out = job.folder / f"attempt-{job.submission.attempts}"
        store.write_atomic(out / "students" / job.submission.student / "report.html", "<p>graded</p>")
        (job.folder / f"attempt-{job.submission.attempts}.log").write_text("graded\n")
        return Grade(1.0, 1.0, "test stand-in", None, {"gelu": {"score": 1.0, "max_score": 1.0,
                                                               "status": "graded"}}), []


def test_a_server_start_and_a_graded_upload_leave_nothing_readable_by_others(tmp_path):
    folder = tmp_path / "serve-dir"
    previous = os.umask(0o022)  # a typical login umask: the server must not depend on a strict one
    try:
        # the real start: what `grader serve` creates before it listens (database, secret, serve.json)
        started = helpers.start_server(folder)
        started.stop()
        token = helpers.add_students(folder, "alice")["alice"]
        with storage.private_umask(), helpers.in_process_server(folder, ReportWritingStandIn(),
                                                                start_workers=False) as server:
            status, data = helpers.upload(server.url, token, helpers.gelu_zip(tmp_path / "alice.zip"))
            assert status == 201, data
            db = server.service.db
            grading_threads.Pool(db, server.service.backend, folder=folder)._grade(queue.claim_next(db))
            assert queue.get(db, data["id"]).status == "done"
            assert helpers.http(server.url + "/instructor/grades.csv", token=started_instructor(started))[0] == 200
    finally:
        os.umask(previous)
    made = {p.relative_to(folder).parts[0] for p in folder.rglob("*")}
    assert {"serve.sqlite3", "submissions", "secret.txt", "serve.json", "class"} <= made, made
    assert list(folder.glob("submissions/*/upload/alice.zip")) and list(folder.glob("submissions/*/attempt-*.log"))
    assert list(folder.glob("submissions/*/attempt-*/students/alice/report.html"))
    assert _open_paths(folder) == []


def started_instructor(server: helpers.ServerProcess) -> str:
    found = re.search(r"instructor token \(shown once; keep it private\): (\S+)", server.log.read_text())
    assert found, server.log.read_text()
    return found.group(1)


def test_a_folder_left_open_by_an_earlier_version_is_tightened_on_start_with_a_note(tmp_path, capsys):
    folder = tmp_path / "serve-dir"
    (folder / "submissions" / "1" / "upload").mkdir(parents=True, mode=0o755)
    (folder / "submissions" / "1" / "upload" / "a.zip").write_bytes(b"zip")
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    assert cli.main(["serve", "roster", "list", "--dir", str(folder)]) == 0
    assert "were readable by others: now the owner's only" in capsys.readouterr().err
    assert _open_paths(folder) == []


def test_tighten_leaves_links_alone_and_reports_what_it_changed(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours")
    os.chmod(outside, 0o644)
    folder = storage.make_private_dir(tmp_path / "a" / "b")
    (folder / "open.txt").write_text("x")
    os.chmod(folder / "open.txt", 0o664)
    (folder / "link").symlink_to(outside)
    assert storage.tighten(folder) == [folder / "open.txt"]
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644  # chmod did not follow the link out of the folder
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700  # the parents made are private too
