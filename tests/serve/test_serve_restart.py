"""Nothing is lost: ``kill -9`` of ``grader serve`` while it grades, then a restart — the submission that was being
graded is queued again and graded from scratch, every queued one completes, each exactly once (one gradebook entry
per submission), and the export holds every student. The grading child dies with the server."""

from __future__ import annotations

import csv
import json
import subprocess
import time

from .. import sandboxing
from . import serve_helpers as helpers

DONE_TIMEOUT_S = 150.0


def test_kill_9_mid_grading_then_restart_grades_every_submission_exactly_once(tmp_path):
    folder = tmp_path / "serve-dir"
    tokens = helpers.add_students(folder, "s1", "s2")
    server = helpers.start_server(folder)
    try:
        ids = []
        for student in ("s1", "s2", "s1"):
            status, data = helpers.upload(server.url, tokens[student], helpers.gelu_zip(tmp_path / f"{student}.zip"))
            assert status == 201, data
            ids.append(data["id"])
        deadline = time.monotonic() + 60
        while not helpers.rows(folder, "SELECT id FROM submissions WHERE status = 'running'"):
            assert time.monotonic() < deadline, "nothing started grading"
            time.sleep(0.05)
        killed = helpers.rows(folder, "SELECT id, attempts FROM submissions WHERE status = 'running'")[0]
        time.sleep(1.0)  # into the grading: its child is importing, planning or running the worker
        graded = helpers.rows(folder, f"SELECT 1 FROM gradebook WHERE submission = {killed[0]}")
        assert not graded, "graded too fast to kill"
        server.kill()
    finally:
        server.stop()
    # the grading child (and its workers) died with the server: nothing of it grades on behind our back
    deadline = time.monotonic() + 20
    while sandboxing.live_processes_with(str(folder)):
        assert time.monotonic() < deadline, f"left running: {sandboxing.live_processes_with(str(folder))}"
        time.sleep(0.2)
    assert helpers.rows(folder, f"SELECT status FROM submissions WHERE id = {killed[0]}") == [("running",)]

    server = helpers.start_server(folder, port=server.port)
    try:
        deadline = time.monotonic() + DONE_TIMEOUT_S
        while helpers.rows(folder, "SELECT COUNT(*) FROM submissions WHERE status IN ('queued', 'running')")[0][0]:
            assert time.monotonic() < deadline, helpers.rows(folder, "SELECT id, status, message FROM submissions")
            time.sleep(0.2)
    finally:
        server.stop()
    assert "were being graded when the server stopped: queued again" in server.log.read_text()
    assert helpers.rows(folder, "SELECT id, status FROM submissions ORDER BY id") == [(i, "done") for i in ids]
    # graded again from scratch: a second attempt, and exactly one gradebook entry per submission
    assert helpers.rows(folder, f"SELECT attempts FROM submissions WHERE id = {killed[0]}") == [(killed[1] + 1,)]
    assert sorted(helpers.rows(folder, "SELECT submission FROM gradebook")) == [(i,) for i in ids]
    assert all(score > 9 for (score,) in helpers.rows(folder, "SELECT score FROM gradebook"))
    # every submission is a batch of its own, all sharing the server's references: the last one computed none
    (last,) = (folder / "submissions" / str(ids[2])).glob("attempt-*/students/*/state/gelu.json")
    counts = json.loads(last.read_text())["counts"]
    assert counts["references computed"] == 0 and counts["references reused"] > 0, counts

    out = tmp_path / "export"
    done = subprocess.run(helpers.grader_command("serve", "export", "--dir", str(folder), "--out", str(out)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with open(out / "grades.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["s1", "s2"] and all(r["gelu"] == "9.26" for r in rows.values())
    assert (out / "students" / "s1" / "results.json").is_file() and (out / "class-report.html").is_file()
    assert "#" + str(ids[2]) in rows["s1"]["source"]  # s1's latest submission is the one in the gradebook
