"""Regrades after a grader fix: ``grader serve regrade`` queues stored submissions to be graded again; the earlier
result is kept as history and marked superseded once the regrade is graded (on the instructor's page and in the API),
the new result counts (standings, grades.csv), other students' submissions are untouched, and the regrade is in the
audit log with its reason. Regrades wait behind uploads and count against no student's limits."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from grader import cli, exercises
from grader.grading import config
from grader.grading.results import store
from grader.grading.results.results import CheckResult, ExerciseResult, PartResult
from grader.grading.results.scoring import points_text
from grader.serve import audit, gradebook, outcome, queue, storage, tokens
from grader.serve import policy as policy_mod
from grader.serve.backend import Job
from grader.serve.db import Database
from grader.serve.grading_threads import Pool
from grader.serve.records import Submission

from . import serve_helpers as helpers

FULL = 9.26  # what the grader gives gelu's one passed example on a CPU
RULES = policy_mod.Policy(submissions_per_hour=100, queued_per_student=10)


@dataclass
class BuggyThenFixedBackend:
    """A TEST STAND-IN for the grading engine that writes a result folder as the engine does: gelu's one example
    fails while ``fixed`` is False (the grader's bug), passes once it is True (the fix)."""

    fixed: bool = False

    def grade(self, job: Job):
        name = f"attempt-{job.submission.attempts}"
        out = job.folder / name
        student = job.submission.student
        part = PartResult("forward", "graded")
        part.checks = [CheckResult("forward.examples[0]", "example", "0", "passed" if self.fixed else "failed")]
        store.save_exercise(out, student, ExerciseResult("gelu", "GeLU", "graded", parts=[part],
                                                         device={"kind": "cpu", "name": "cpu"}))
        store.save_submission(out, student, {"source": "upload", "kind": "upload", "problems": []})
        store.write_run(out, {"exercises": ["gelu"], "device": "cpu", "started": "-"})
        return outcome.read(out, folder=name, course=config.load_course(), all_exercises=exercises.all_exercises())


def hand_in(db: Database, folder: Path, student: str, *, at: float | None = None) -> int:
    def place(submission_id: int) -> None:
        target = storage.upload_path(folder, Submission(submission_id, student, "mine.zip", "zip", 1, [], [], 0.0,
                                                        queue.QUEUED, 0, None, None, ""))
        storage.make_private_dir(target.parent)
        target.write_bytes(b"PK")

    return queue.enqueue(db, student=student, filename="mine.zip", kind="zip", size=2, exercises=["gelu"], late=[],
                         policy=RULES, place=place, now=at)


def _serve(capsys, folder: Path, *args: str) -> tuple[int, str, str]:
    status = cli.main(["serve", *args, "--dir", str(folder)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _grades(db: Database, folder: Path, out: Path) -> dict[str, dict[str, str]]:
    return helpers.grades_csv(db, folder, out, RULES)


@pytest.fixture
def graded_with_a_bug(tmp_path):
    folder = tmp_path / "serve-dir"
    db = Database.in_folder(folder)
    for student in ("alice", "bob"):
        tokens.add_student(db, student)
    first, second = hand_in(db, folder, "alice"), hand_in(db, folder, "bob")
    backend = BuggyThenFixedBackend()
    assert Pool(db, backend, folder=folder).drain() == 2
    return db, folder, backend, first, second


def test_a_regrade_counts_once_graded_and_keeps_the_earlier_result_as_superseded_history(graded_with_a_bug, tmp_path,
                                                                                           capsys):
    db, folder, backend, alice_1, bob_1 = graded_with_a_bug
    assert _grades(db, folder, tmp_path / "before")["alice"]["gelu"] == "0"
    backend.fixed = True  # the grader is fixed
    status, out, err = _serve(capsys, folder, "regrade", "--student", "alice", "--reason", "gelu's atol was wrong")
    assert status == 0, err
    regrade = int(out.split("\t")[1].strip().lstrip("#"))
    assert out == f"#{alice_1}\t#{regrade}\n" and "1 submission(s) queued to be graded again" in err

    # queued, not graded yet: the earlier result still counts
    by_student = {s.student: s for s in gradebook.standings(db, RULES)}
    assert by_student["alice"].counting["gelu"]["submission"] == alice_1
    assert queue.get(db, alice_1).superseded_by is None

    assert Pool(db, backend, folder=folder).drain() == 1
    earlier, again = queue.get(db, alice_1), queue.get(db, regrade)
    assert earlier.superseded_by == regrade and again.regrade_of == alice_1 and again.status == queue.DONE
    assert earlier.created == again.created  # handed in when the upload was: late or not as it was
    assert queue.grade_of(db, alice_1).score == 0 and queue.grade_of(db, regrade).score == pytest.approx(FULL, abs=0.01)
    rows = _grades(db, folder, tmp_path / "after")
    assert rows["alice"]["gelu"] == points_text(FULL) and rows["bob"]["gelu"] == "0"  # bob: untouched
    by_student = {s.student: s for s in gradebook.standings(db, RULES)}
    assert by_student["alice"].counting["gelu"]["submission"] == regrade
    assert by_student["alice"].latest_id == regrade and by_student["alice"].submissions == 1  # one hand-in
    assert queue.get(db, bob_1).superseded_by is None and len(queue.of_student(db, "bob")) == 1

    logged = audit.entries(db, action="regrade")
    assert [(e.actor, e.subject) for e in logged] == [("cli", f"#{alice_1}")]
    assert "gelu's atol was wrong" in logged[0].detail and f"#{regrade}" in logged[0].detail
    new_score = queue.grade_of(db, regrade).score
    assert audit.entries(db, action="regrade-done")[0].detail == f"superseded by #{regrade}: 0 -> {new_score:g}"

    instructor = tokens.instructor_token(db)
    student = tokens.reissue(db, "alice")
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), start_workers=False) as server:
        data = json.loads(helpers.http(f"{server.url}/api/submissions/{alice_1}", token=instructor)[1])
        assert data["superseded"] is True and data["superseded_by"] == regrade and data["grade"]["score"] == 0
        data = json.loads(helpers.http(f"{server.url}/api/submissions/{regrade}", token=student)[1])
        assert data["regrade_of"] == alice_1 and data["superseded"] is False and data["counts_for"] == ["gelu"]
        page = helpers.http(server.url + "/instructor", token=instructor)[1].decode()
        assert f'data-id="{alice_1}" data-status="done" data-superseded-by="{regrade}"' in page
        assert f"(superseded by #{regrade}: its result counts instead)" in page
        assert f"regrade of #{alice_1}; graded" in page


def test_what_a_regrade_selects_and_skips(graded_with_a_bug, capsys):
    db, folder, _backend, alice_1, bob_1 = graded_with_a_bug
    waiting = hand_in(db, folder, "bob")
    status, out, err = _serve(capsys, folder, "regrade", "--exercise", "gelu", "--reason", "fix")
    assert status == 0 and sorted(out.splitlines()) == sorted([f"#{alice_1}\t#{waiting + 1}",
                                                               f"#{bob_1}\t#{waiting + 2}"]), (out, err)
    assert f"#{waiting} not regraded: queued" in err
    status, out, err = _serve(capsys, folder, "regrade", "--submission", str(alice_1), "--reason", "again")
    assert status == 0 and out == "" and f"its regrade #{waiting + 1} is waiting already" in err
    for args, message in ((("--all", "--reason", " "), "a regrade needs a reason"),
                          (("--reason", "x"), "say what to regrade"),
                          (("--student", "mallory", "--reason", "x"), "mallory is not on the roster"),
                          (("--submission", "99", "--reason", "x"), "no submission #99")):
        status, _, err = _serve(capsys, folder, "regrade", *args)
        assert status == 2 and message in err, (args, err)
    # the upload waiting goes first; regrades count against no student's limits
    assert queue.claim_next(db).id == waiting
    queue.precheck(db, "alice", policy_mod.Policy(submissions_per_hour=2, queued_per_student=1, queued_total=1))


def test_regrades_wait_behind_uploads_in_the_order():
    waiting = [queue.Waiting(1, "alice", 10.0, regrade=True), queue.Waiting(2, "bob", 20.0, regrade=True),
               queue.Waiting(3, "carol", 30.0), queue.Waiting(4, "alice", 40.0)]
    assert queue.order(waiting, last_started={}) == [3, 4, 1, 2]
