"""Units of ``grader serve``: the queue's order and bounds, deadlines, tokens, migrations, recording a grade exactly
once, recovery after a stop, the course file's [serve] table, upload checks, and the leaderboard's times."""

from __future__ import annotations

import datetime as dt
import hashlib
import sqlite3
import sys
import zipfile
from types import SimpleNamespace

import pytest

from grader import exercises
from grader.grading import config
from grader.grading.results.class_report import anonymous_id
from grader.grading.results.results import CheckResult, ExerciseResult, PartResult, SpeedResult
from grader.serve import backend as backend_mod
from grader.serve import db as db_mod
from grader.serve import intake, leaderboard, outcome, policy, queue, tokens
from grader.serve.records import Grade, Principal, SpeedTime
from grader.speed import credit
from grader.speed.credit import BenchmarkCredit
from tests.gates import until

from . import serve_helpers as helpers

GELU = tuple(e for e in exercises.all_exercises() if e.name == "gelu")
OPEN = policy.Policy(submissions_per_hour=100, queued_per_student=100)


@pytest.fixture
def db(tmp_path):
    database = db_mod.Database.in_folder(tmp_path / "serve-dir")
    for student in ("a", "b", "c"):
        tokens.add_student(database, student)
    return database


def _queue(db, student: str, *, now: float, rules: policy.Policy = OPEN) -> int:
    return queue.enqueue(db, student=student, filename="x.zip", kind="zip", size=1, exercises=["gelu"], late=[],
                         policy=rules, now=now)


# ------------------------------------------------------------------------------------------ order


def test_order_is_round_robin_longest_waiting_student_first():
    W = queue.Waiting
    waiting = [W(1, "a", 1.0), W(2, "a", 2.0), W(3, "a", 3.0), W(4, "b", 4.0), W(5, "c", 5.0), W(6, "b", 6.0)]
    assert queue.order(waiting, last_started={}) == [1, 4, 5, 2, 6, 3]
    # a served recently waits since then: c (waiting since 5) goes before a (served at 10) and b (served at 9)
    assert queue.order(waiting, last_started={"a": 10.0, "b": 9.0}) == [5, 4, 1, 6, 2, 3]
    # a student graded now goes last in the round
    assert queue.order(waiting, last_started={}, running=["a"]) == [4, 5, 1, 6, 2, 3]


def test_claim_takes_one_per_student_at_a_time_in_round_robin(db):
    for i, student in enumerate(["a", "a", "a", "b", "c"]):
        _queue(db, student, now=float(i))
    first = queue.claim_next(db, now=10.0)
    second = queue.claim_next(db, now=11.0)
    third = queue.claim_next(db, now=12.0)
    assert [first.student, second.student, third.student] == ["a", "b", "c"]
    assert queue.claim_next(db, now=13.0) is None  # a's next waits: a is being graded
    assert queue.positions(db) == {2: 1, 3: 2}
    grade = Grade(1.0, 1.0, "cpu", None, {})
    assert queue.finish(db, first, grade, [], now=14.0)
    assert queue.claim_next(db, now=15.0).id == 2


# ------------------------------------------------------------------------------------------ bounds


def test_rate_limit_per_student_and_hour(db):
    rules = policy.Policy(submissions_per_hour=2, queued_per_student=10)
    _queue(db, "a", now=1000.0, rules=rules)
    _queue(db, "a", now=1100.0, rules=rules)
    with pytest.raises(queue.Refused) as refused:
        _queue(db, "a", now=1200.0, rules=rules)
    assert refused.value.status == 429 and refused.value.retry_after_s == 1000 + 3600 - 1200 + 1
    _queue(db, "b", now=1200.0, rules=rules)  # others are not held back
    _queue(db, "a", now=1000.0 + 3601, rules=rules)  # an hour after the first, one more


def test_waiting_submissions_per_student_are_bounded(db):
    rules = policy.Policy(submissions_per_hour=100, queued_per_student=2)
    _queue(db, "a", now=1.0, rules=rules)
    _queue(db, "a", now=2.0, rules=rules)
    with pytest.raises(queue.Refused, match="waiting already"):
        _queue(db, "a", now=3.0, rules=rules)
    queue.claim_next(db, now=4.0)  # one leaves the queue: room for another
    _queue(db, "a", now=5.0, rules=rules)


# ------------------------------------------------------------------------------------------ deadlines


def _accept(db, tmp_path, rules, *, now: float):
    return intake.accept(db, folder=tmp_path, student="a", filename="a.zip",
                         data_file=helpers.gelu_zip(tmp_path / "up.zip"), size=100, policy=rules, selected=GELU,
                         now=now)


def test_deadlines_mark_late_or_refuse(db, tmp_path):
    due = dt.datetime(2030, 1, 1, tzinfo=dt.UTC).timestamp()
    marking = policy.Policy(submissions_per_hour=100, queued_per_student=100, late="mark", deadlines={"gelu": due})
    assert _accept(db, tmp_path, marking, now=due - 1).late == []
    late = _accept(db, tmp_path, marking, now=due + 1)
    assert late.late == ["gelu"] and late.exercises == ["gelu"]
    assert queue.get(db, late.id).late == ["gelu"]
    refusing = policy.Policy(submissions_per_hour=100, queued_per_student=100, late="refuse", deadlines={"gelu": due})
    with pytest.raises(queue.Refused, match="deadline of gelu has passed") as refused:
        _accept(db, tmp_path, refusing, now=due + 1)
    assert refused.value.status == 403


def test_the_serve_table_of_a_course_file(tmp_path):
    course = tmp_path / "course.toml"
    course.write_text('[course]\ntotal = 50.0\n\n[serve]\nsubmissions_per_hour = 4\nlate = "refuse"\n\n'
                      "[serve.deadlines]\ngelu = 2030-01-01T00:00:00Z\n\n[grading]\nrandom_cases_cpu = 1\n")
    rules = policy.load(course, known=("gelu",))
    assert rules.submissions_per_hour == 4 and rules.late == "refuse" and rules.queued_per_student == 3  # default
    assert rules.deadlines == {"gelu": dt.datetime(2030, 1, 1, tzinfo=dt.UTC).timestamp()}
    # the grading engine reads the same file: it leaves [serve] to the server and keeps every other table
    loaded = config.load_course(course)
    assert loaded.total == 50.0 and loaded.setting("random_cases", "cpu") == 1
    assert policy.load(None).late == "mark"  # the bundled defaults
    course.write_text('[serve]\nlate = "sometimes"\n')
    with pytest.raises(policy.PolicyError, match="late must be one of"):
        policy.load(course)


# ------------------------------------------------------------------------------------------ uploads


def test_uploads_are_checked_by_the_grader_submission_code(db, tmp_path):
    slip = tmp_path / "slip.zip"
    with zipfile.ZipFile(slip, "w") as zf:
        zf.writestr("../../escape.py", "x = 1\n")
        zf.writestr("assignments/gelu/gelu.py", helpers.GELU.read_text())
    accepted = intake.accept(db, folder=tmp_path, student="a", filename="slip.zip", data_file=slip, size=1,
                             policy=OPEN, selected=GELU)
    assert any("outside the archive" in p for p in accepted.problems)
    assert not (tmp_path.parent / "escape.py").exists()
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(queue.Refused, match="not a valid zip") as refused:
        intake.accept(db, folder=tmp_path, student="a", filename="b.zip", data_file=broken, size=1, policy=OPEN,
                      selected=GELU)
    assert refused.value.status == 422
    with pytest.raises(queue.Refused) as refused:
        intake.accept(db, folder=tmp_path, student="a", filename="b.tar", data_file=broken, size=1, policy=OPEN,
                      selected=GELU)
    assert refused.value.status == 415
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("notes.txt", "nothing here")
    with pytest.raises(queue.Refused):
        intake.accept(db, folder=tmp_path, student="a", filename="e.zip", data_file=empty, size=1, policy=OPEN,
                      selected=GELU)
    assert [s.id for s in queue.of_student(db, "a")] == [accepted.id]  # refused uploads are not queued


# ------------------------------------------------------------------------------------------ tokens


def test_tokens_are_stored_as_hashes_only(tmp_path):
    database = db_mod.Database.in_folder(tmp_path)
    token = tokens.add_student(database, "alice", display_name="Alice")
    assert len(token) >= 40  # 32 random bytes
    stored = [r["hash"] for r in database.query("SELECT hash FROM tokens")]
    assert stored == [hashlib.sha256(token.encode()).hexdigest()]
    assert token.encode() not in (tmp_path / db_mod.FILE).read_bytes()
    assert tokens.authenticate(database, token) == Principal("student", "alice")
    assert tokens.authenticate(database, token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    instructor = tokens.instructor_token(database)
    assert tokens.authenticate(database, instructor) == Principal("instructor", None)
    session = tokens.open_session(database, token)
    assert tokens.session_principal(database, session) == Principal("student", "alice")
    tokens.close_session(database, session)
    assert tokens.session_principal(database, session) is None
    with pytest.raises(tokens.RosterError, match="already"):
        tokens.add_student(database, "alice")
    with pytest.raises(tokens.RosterError, match="plain student id"):
        tokens.add_student(database, "../alice")


def test_a_token_never_reads_as_a_command_line_option(monkeypatch):
    """One URL-safe random text in 64 begins with '-': `--token -x...` would then be refused by the command line
    as a missing value."""
    from grader import cli
    monkeypatch.setattr(tokens.secrets, "token_urlsafe", lambda n: "-" + "x" * 42)
    token = tokens.new_token()
    assert not token.startswith("-")
    args = cli._parser().parse_args(["results", "--server", "http://h", "--token", token])
    assert args.token == token


def test_roster_import(tmp_path):
    database = db_mod.Database.in_folder(tmp_path / "d")
    tokens.add_student(database, "alice")
    roster = tmp_path / "roster.csv"
    roster.write_text("student,name\nalice,Alice\nbob,Bob B.\ncarol,\n")
    added = tokens.import_roster(database, roster)
    assert [s for s, _ in added] == ["bob", "carol"]  # alice is on the roster already: no new token
    assert [(s.id, s.display_name) for s in tokens.students(database)] == [("alice", None), ("bob", "Bob B."),
                                                                           ("carol", None)]


# ------------------------------------------------------------------------------------------ migrations


def test_migrations_apply_forward_and_refuse_a_newer_schema(tmp_path):
    path = tmp_path / db_mod.FILE
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (1)")
    for statement in db_mod._statements(db_mod.MIGRATIONS[0]):
        conn.execute(statement)
    conn.execute("INSERT INTO students (id, created) VALUES ('old', 0)")
    conn.close()
    database = db_mod.Database(path)  # a version-1 database: migrated forward, its rows kept
    assert db_mod.schema_version(database.connection()) == db_mod.VERSION
    assert [r["id"] for r in database.query("SELECT id FROM students")] == ["old"]
    assert database.query("SELECT COUNT(*) AS n FROM sessions")[0]["n"] == 0
    database.close()
    assert db_mod.schema_version(db_mod.Database(path).connection()) == db_mod.VERSION  # opening again: no change
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.close()
    with pytest.raises(db_mod.SchemaError, match="version 99"):
        db_mod.Database(path)


# ------------------------------------------------------------------------------------ exactly once


def test_a_grade_is_recorded_exactly_once_and_running_work_is_requeued(db):
    sid = _queue(db, "a", now=1.0)
    first = queue.claim_next(db, now=2.0)
    assert queue.requeue_running(db) == [sid]  # the server stopped while grading it
    again = queue.claim_next(db, now=3.0)
    assert again.id == sid and again.attempts == 2
    grade = Grade(2.0, 3.0, "cpu", "attempt-2", {"gelu": {"score": 2.0, "max_score": 3.0, "status": "graded"}})
    assert not queue.finish(db, first, grade, [])  # the stale attempt records nothing
    assert queue.finish(db, again, grade, [])
    assert not queue.finish(db, again, grade, [])  # a second finish of the same attempt: nothing more
    assert db.query("SELECT COUNT(*) AS n FROM gradebook")[0]["n"] == 1
    assert queue.grade_of(db, sid) == Grade(2.0, 3.0, "cpu", "attempt-2", grade.exercises, [],
                                            queue.grade_of(db, sid).graded)


def test_a_grader_failure_is_retried_then_marked_failed(db):
    sid = _queue(db, "a", now=1.0)
    for attempt in range(1, queue.MAX_ATTEMPTS + 1):
        sub = queue.claim_next(db, now=float(attempt))
        assert sub.attempts == attempt
        status = queue.give_up_or_retry(db, sub, "boom")
    assert status == "failed" and queue.get(db, sid).status == "failed"
    assert queue.claim_next(db) is None


# ------------------------------------------------------------------------------------------ speed


def _result(status: str, rows: list[BenchmarkCredit], device: dict) -> ExerciseResult:
    part = PartResult("forward", "graded", speed=SpeedResult(status, rows=rows))
    return ExerciseResult("gelu", "GeLU", "graded", parts=[part], device=device)


def test_leaderboard_times_come_from_the_results_speed_rows(db):
    row = BenchmarkCredit(label="fp16 4096x4096", baseline="torch", student_ms=0.25, baseline_ms=0.5, ratio=2.0)
    measured = _result(credit.MEASURED, [row], {"kind": "cuda", "name": "NVIDIA H100"})
    assert outcome.speed_times(measured) == [SpeedTime("gelu", "forward", "fp16 4096x4096", 0.25, 2.0, "NVIDIA H100")]
    # the same row through the stored form (details.json / state/<exercise>.json) reads the same
    assert outcome.speed_times(ExerciseResult.from_dict(measured.to_dict())) == outcome.speed_times(measured)
    on_cpu = _result(credit.NOT_MEASURED, [BenchmarkCredit(label="x", baseline="torch")], {"kind": "cpu"})
    assert outcome.speed_times(on_cpu) == []
    flagged = _result(credit.MEASURED, [row], {"name": "NVIDIA H100"})
    flagged.parts[0].flags.append({"rule": "timer", "message": "replaced", "scope": "speed"})
    assert outcome.speed_times(flagged) == []
    wrong = _result(credit.MEASURED, [row], {"name": "NVIDIA H100"})  # fast, but wrong on one hidden case
    wrong.parts[0].checks = [CheckResult("forward.examples[0]", "example", "0", "passed"),
                             CheckResult("forward.random[3]", "random", "3", "failed", "12 of 4096 elements differ")]
    assert outcome.speed_times(wrong) == []
    wrong.parts[0].checks[1].status = "passed"
    assert len(outcome.speed_times(wrong)) == 1

    with db.transaction() as conn:
        conn.execute("UPDATE students SET display_name = 'Bee', leaderboard = 1 WHERE id = 'b'")
    for student, ms in (("a", 0.3), ("b", 0.2), ("a", 0.25)):
        _queue(db, student, now=1.0)
        sub = queue.claim_next(db)
        time_row = SpeedTime("gelu", "forward", "fp16", ms, 0.5 / ms, "NVIDIA H100")
        assert queue.finish(db, sub, Grade(1.0, 1.0, "gpu", None, {}), [time_row])
    (board,) = leaderboard.boards(db, viewer=Principal("student", "a"), salt="s")
    assert [(e.rank, e.student_ms, e.mine) for e in board.entries] == [(1, 0.2, False), (2, 0.25, True)]
    assert board.entries[0].name == "Bee"  # opted in
    assert board.entries[1].name == anonymous_id("a", "s")  # not opted in: anonymous (a's best of two)
    assert board.entries[1].device == "NVIDIA H100" and len(board.entries[1].date) == 10


def test_parts_the_grader_failed_on_are_graded_again_before_the_grade_is_recorded(tmp_path, monkeypatch):
    """``grader grade`` exits NEEDS_REGRADE where the grader failed on some parts: the backend runs it again on the
    same folder (which resumes exactly those parts) up to REGRADES times; a status that is not a grade is the
    grader's failure (retried by the queue), never a score of the student's."""
    runs = tmp_path / "runs"
    statuses = iter([backend_mod.NEEDS_REGRADE, backend_mod.NEEDS_REGRADE, 0])
    engine = backend_mod.EngineBackend(options=config.GradeOptions(exercises=("gelu",)), secret="s",
                                       course=config.load_course(None))
    monkeypatch.setattr(engine, "command", lambda spec: [sys.executable, "-c", "import sys, pathlib; "
                        f"p = pathlib.Path({str(runs)!r}); p.write_text(p.read_text() + 'x' if p.exists() else 'x'); "
                        f"sys.exit({next(statuses)})"])
    sub = queue.Submission(1, "alice", "alice.zip", "zip", 10, ["gelu"], [], 0.0, "running", 1, 0.0, None, "")
    job = backend_mod.Job(sub, tmp_path / "alice.zip", tmp_path / "sub")
    job.folder.mkdir()
    with pytest.raises(backend_mod.GradingFailed, match="no readable result"):  # the stand-in grades nothing
        engine.grade(job)
    assert runs.read_text() == "xxx"  # graded, then twice again for the parts that needed it
    statuses = iter([2] * 5)  # a usage error of the engine: not a grade
    runs.unlink()
    with pytest.raises(backend_mod.GradingFailed, match="status 2"):
        engine.grade(job)
    assert runs.read_text() == "x"


def test_a_worker_that_cannot_record_an_outcome_requeues_it_and_goes_on(db, tmp_path, monkeypatch):
    """The database refuses to record a grade once (busy, or its disk full): the worker thread survives, the
    submission is queued again and graded on its next attempt, and the student's later submission is graded too
    (before, the thread ended and both waited for a restart)."""
    from grader.serve.grading_threads import Pool

    first, second = _queue(db, "a", now=1.0), _queue(db, "a", now=2.0)
    finish, failures = queue.finish, []

    def flaky_finish(database, submission, grade, times):
        if not failures:
            failures.append(submission.id)
            raise sqlite3.OperationalError("database is locked")
        return finish(database, submission, grade, times)

    monkeypatch.setattr(queue, "finish", flaky_finish)
    backend = SimpleNamespace(grade=lambda job: (Grade(1.0, 1.0, "cpu", None, {}), []))  # a made-up full score
    pool = Pool(db, backend, folder=tmp_path / "serve-dir", workers=1)
    pool.start()
    try:
        until(lambda: all(queue.get(db, s).status == "done" for s in (first, second)), "both graded", 30,
              look_s=0.05)
    finally:
        pool.stop()
    assert failures == [first]
    assert [queue.get(db, s).status for s in (first, second)] == ["done", "done"]
    assert queue.get(db, first).attempts == 2  # graded again after the failed record
    assert db.query("SELECT COUNT(*) AS n FROM gradebook")[0]["n"] == 2
