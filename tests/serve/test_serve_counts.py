"""Which submission counts: ``[serve] counts = "latest"`` (the latest on-time submission of each exercise: the
default) or ``"best"`` (the best on-time score), in grades.csv, the standings and the instructor's page, and said on
the student's own page (where they hand in) and on a submission's page."""

from __future__ import annotations

import csv
import io
import json

import pytest

from grader.grading.results.scoring import points_text
from grader.serve import policy as policy_mod
from grader.serve import tokens
from grader.serve.db import Database
from grader.serve.grading_threads import Pool

from . import serve_helpers as helpers
from .test_serve_regrade import BuggyThenFixedBackend, hand_in


@pytest.fixture
def better_earlier(tmp_path):
    """alice: #1 passes (full points), then #2 fails (0), both on time; bob: one failing submission."""
    folder = tmp_path / "serve-dir"
    db = Database.in_folder(folder)
    for student in ("alice", "bob"):
        tokens.add_student(db, student)
    backend = BuggyThenFixedBackend(fixed=True)
    good = hand_in(db, folder, "alice", at=1000.0)
    Pool(db, backend, folder=folder).drain()
    backend.fixed = False
    worse = hand_in(db, folder, "alice", at=2000.0)
    bob = hand_in(db, folder, "bob", at=2000.0)
    Pool(db, backend, folder=folder).drain()
    return folder, good, worse, bob


@pytest.mark.parametrize("counts", ["latest", "best"])
def test_the_counting_submission_follows_the_setting(better_earlier, counts):
    folder, good, worse, bob = better_earlier
    db = Database.in_folder(folder)
    instructor = tokens.instructor_token(db)
    alice = tokens.reissue(db, "alice")
    rules = policy_mod.Policy(submissions_per_hour=100, queued_per_student=10, counts=counts)
    chosen = good if counts == "best" else worse
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), policy=rules,
                                   start_workers=False) as server:
        status, body = helpers.http(server.url + "/instructor/grades.csv", token=instructor)
        assert status == 200
        rows = {r["student"]: r for r in csv.DictReader(io.StringIO(body.decode()))}
        full = points_text(json.loads(helpers.http(f"{server.url}/api/submissions/{good}", token=alice)[1])
                           ["grade"]["score"])
        assert rows["alice"]["gelu"] == (full if counts == "best" else "0") and rows["bob"]["gelu"] == "0"
        assert f"#{chosen}" in rows["alice"]["source"]

        standings = json.loads(helpers.http(server.url + "/api/instructor/students", token=instructor)[1])
        assert standings["counts"] == counts
        by_student = {s["student"]: s for s in standings["students"]}
        assert by_student["alice"]["counting"]["gelu"]["submission"] == chosen
        assert by_student["bob"]["counting"]["gelu"]["submission"] == bob
        assert (by_student["alice"]["latest_id"], by_student["alice"]["best_id"]) == (worse, good)

        page = helpers.http(server.url + "/instructor", token=instructor)[1].decode()
        assert f"each student's {counts} on-time submission per exercise" in page
        assert f"gelu: {float(rows['alice']['gelu']):.2f} (#{chosen})" in page

        page = helpers.http(server.url + "/me", token=alice)[1].decode()
        assert f'<p id="counts-rule">Your {counts} on-time submission counts (per exercise).</p>' in page
        mine = json.loads(helpers.http(server.url + "/api/submissions", token=alice)[1])["submissions"]
        assert {s["id"]: s["counts_for"] for s in mine} == {good: ["gelu"] if counts == "best" else [],
                                                            worse: [] if counts == "best" else ["gelu"]}
        page = helpers.http(f"{server.url}/submissions/{chosen}", token=alice)[1].decode()
        assert f"Your {counts} on-time submission counts (per exercise). It counts for: gelu." in page


def test_counts_is_latest_or_best():
    assert policy_mod.from_table({}, source="course.toml").counts == "latest"
    assert policy_mod.from_table({"counts": "best"}, source="course.toml").counts == "best"
    with pytest.raises(policy_mod.PolicyError, match="counts must be one of latest, best, not 'first'"):
        policy_mod.from_table({"counts": "first"}, source="course.toml")
    penalty = policy_mod.Policy(late="penalty", penalty_per_day=0.1, counts="best")
    assert penalty.counting_rule() == ("Your best submission counts (per exercise); a late one counts 10% less per "
                                       "started day late.")
