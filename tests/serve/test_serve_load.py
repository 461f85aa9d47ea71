"""A bounded load test of ``grader serve``'s queue, against a server whose grading backend is a test stand-in
(:class:`tests.serve.serve_helpers.SleepingStandInBackend`): 20 students × 3 submissions from a thread pool — nothing is
lost, no student ever has two gradings at once, and the students are served round-robin. It stops by itself."""

from __future__ import annotations

import itertools
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import pytest

from grader.serve import db as db_mod
from grader.serve.records import Principal
from tests.gates import until

from . import serve_helpers as helpers

STUDENTS, EACH = 20, 3
TIMEOUT_S = 60.0
FINISHED = "SELECT COUNT(*) FROM submissions WHERE status NOT IN ('queued', 'running')"


def test_twenty_students_three_submissions_each_nothing_lost_fair_and_one_at_a_time(tmp_path):
    folder = tmp_path / "serve-dir"
    names = [f"student{i:02d}" for i in range(STUDENTS)]
    tokens = helpers.add_students(folder, *names)
    backend = helpers.SleepingStandInBackend(seconds=0.02)
    zips = {n: helpers.gelu_zip(tmp_path / f"{n}.zip") for n in names}
    # the workers start once every submission is in: the order then shows the queue's policy, not arrival luck
    with helpers.in_process_server(folder, backend, workers=2, start_workers=False) as server:
        # students upload at once; each student's own uploads one after another (one upload in flight per student)
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = [answer for each in pool.map(
                lambda n: [helpers.upload(server.url, tokens[n], zips[n]) for _ in range(EACH)], names,
                timeout=TIMEOUT_S) for answer in each]
        assert [status for status, _ in answers] == [201] * STUDENTS * EACH, answers[:3]
        server.service.pool.start()
        until(lambda: helpers.rows(folder, FINISHED) == [(STUDENTS * EACH,)],  # graded and its result recorded
              f"every submission finished within {TIMEOUT_S} s", TIMEOUT_S, look_s=0.05)
    with sqlite3.connect(folder / db_mod.FILE) as conn:
        statuses = conn.execute("SELECT status, COUNT(*) FROM submissions GROUP BY status").fetchall()
        entries = conn.execute("SELECT COUNT(DISTINCT submission), COUNT(*) FROM gradebook").fetchone()
    assert statuses == [("done", STUDENTS * EACH)]  # nothing lost
    assert entries == (STUDENTS * EACH, STUDENTS * EACH)  # each graded exactly once
    assert sorted(i for _, i in backend.started) == sorted(data["id"] for _, data in answers)
    assert backend.overlaps == []  # never two gradings of one student at once
    for student in names:
        spans = sorted((s, e) for who, s, e in backend.spans if who == student)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), student
    # round-robin: every student's first submission before anyone's second, every second before anyone's third
    rounds = [backend.started[i * STUDENTS:(i + 1) * STUDENTS] for i in range(EACH)]
    for served in rounds:
        assert sorted(s for s, _ in served) == names, served


def test_without_the_ownership_check_another_students_report_would_be_served(tmp_path, monkeypatch):
    """What the 403 tests rely on: it is the ownership check (Principal.may_see) that refuses, nothing else."""
    folder = tmp_path / "serve-dir"
    tokens = helpers.add_students(folder, "alice", "bob")
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), workers=1) as server:
        status, data = helpers.upload(server.url, tokens["alice"], helpers.gelu_zip(tmp_path / "a.zip"))
        assert status == 201
        url = f"{server.url}/api/submissions/{data['id']}"
        assert helpers.http(url, token=tokens["bob"])[0] == 403
        monkeypatch.setattr(Principal, "may_see", lambda self, owner: True)
        assert helpers.http(url, token=tokens["bob"])[0] == 200


@pytest.mark.parametrize("per_hour", [2])
def test_the_rate_limit_refuses_with_429_and_retry_after(tmp_path, per_hour):
    from grader.serve.policy import Policy

    folder = tmp_path / "serve-dir"
    tokens = helpers.add_students(folder, "alice", "bob")
    policy = Policy(submissions_per_hour=per_hour, queued_per_student=10)
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), policy=policy,
                                   start_workers=False) as server:
        path = helpers.gelu_zip(tmp_path / "a.zip")
        assert [helpers.upload(server.url, tokens["alice"], path)[0] for _ in range(per_hour)] == [201] * per_hour
        status, data = helpers.upload(server.url, tokens["alice"], path)
        assert status == 429 and "an hour" in data["error"]
        assert helpers.upload(server.url, tokens["bob"], path)[0] == 201  # per student
