"""The "penalty" late policy: a late exercise counts in the gradebook at (1 - penalty_per_day x days late), each
started day counted (never below 0), with a ``late_penalties`` column saying so; an extension makes it on time; an
override has the last word; under "mark" the late submission stays out of the gradebook; the [serve] table checks
penalty_per_day."""

from __future__ import annotations

import datetime as dt

import pytest

from grader.grading.results import store
from grader.grading.results.results import CheckResult, ExerciseResult, PartResult
from grader.grading.results.scoring import points_text
from grader.serve import extensions, overrides, queue, tokens
from grader.serve import policy as policy_mod
from grader.serve.db import Database
from grader.serve.records import Grade

from . import serve_helpers as helpers

DUE = dt.datetime(2025, 10, 10, 23, 59).timestamp()
DAY = policy_mod.DAY_S
FULL = 9.26  # what the grader gives gelu's one passed example on a CPU


def _graded(db: Database, folder, student: str, *, at: float, late: list[str]) -> None:
    """A submission handed in at ``at`` and graded: a result folder as the engine writes one (one check passed)."""
    rules = policy_mod.Policy(submissions_per_hour=100, queued_per_student=10)
    queue.enqueue(db, student=student, filename="a.zip", kind="zip", size=1, exercises=["gelu"], late=late,
                  policy=rules, now=at)
    sub = queue.claim_next(db, now=at)
    out = folder / "submissions" / str(sub.id) / "attempt-1"
    part = PartResult("forward", "graded")
    part.checks = [CheckResult("forward.examples[0]", "example", "0", "passed")]
    store.save_exercise(out, student, ExerciseResult("gelu", "GeLU", "graded", parts=[part],
                                                     device={"kind": "cpu", "name": "cpu"}))
    store.save_submission(out, student, {"source": "upload", "kind": "upload", "problems": []})
    store.write_run(out, {"exercises": ["gelu"], "device": "cpu", "started": "-"})
    assert queue.finish(db, sub, Grade(1.0, 1.0, "cpu", "attempt-1", {}), [], now=at)


def _export(db: Database, folder, out, rules: policy_mod.Policy) -> dict[str, dict[str, str]]:
    return helpers.grades_csv(db, folder, out, rules)


@pytest.fixture
def graded(tmp_path):
    folder = tmp_path / "serve-dir"
    db = Database.in_folder(folder)
    for student in ("alice", "bob", "carol", "dave"):
        tokens.add_student(db, student)
    _graded(db, folder, "alice", at=DUE - DAY, late=[])
    _graded(db, folder, "bob", at=DUE + 1.5 * DAY, late=["gelu"])  # two started days late
    _graded(db, folder, "carol", at=DUE + 1.5 * DAY, late=["gelu"])
    _graded(db, folder, "dave", at=DUE + 30 * DAY, late=["gelu"])
    return db, folder


def test_a_late_exercise_counts_at_the_penalty_per_started_day(graded, tmp_path):
    db, folder = graded
    rules = policy_mod.Policy(late="penalty", penalty_per_day=0.1, deadlines={"gelu": DUE})
    extensions.grant(db, "carol", "gelu", DUE + 2 * DAY, "accommodation", policy=rules)
    rows = _export(db, folder, tmp_path / "out", rules)
    assert rows["alice"]["gelu"] == points_text(FULL) and rows["alice"]["late_penalties"] == ""
    assert rows["bob"]["gelu"] == rows["bob"]["total"] == points_text(FULL * 0.8)
    assert rows["bob"]["late_penalties"] == "gelu: 2 day(s) late, -20%"
    assert rows["carol"]["gelu"] == points_text(FULL) and rows["carol"]["late_penalties"] == ""  # extended
    assert rows["dave"]["gelu"] == "0" and rows["dave"]["late_penalties"] == "gelu: 30 day(s) late, -100%"

    overrides.set_override(db, "bob", "gelu", 9.0, "late-registration exception", known=("gelu",))
    rows = _export(db, folder, tmp_path / "out", rules)
    assert rows["bob"]["gelu"] == "9" and rows["bob"]["override_reasons"] == "gelu: late-registration exception"


def test_under_mark_a_late_submission_stays_out_of_the_gradebook(graded, tmp_path):
    db, folder = graded
    rows = _export(db, folder, tmp_path / "out", policy_mod.Policy(late="mark", deadlines={"gelu": DUE}))
    assert sorted(rows) == ["alice"] and "late_penalties" not in rows["alice"]


@pytest.mark.parametrize("table", [{"late": "penalty"}, {"late": "penalty", "penalty_per_day": 1.5}])
def test_the_penalty_policy_needs_a_fraction_per_day(table):
    with pytest.raises(policy_mod.PolicyError, match="needs penalty_per_day, a fraction"):
        policy_mod.from_table(table, source="course.toml")
