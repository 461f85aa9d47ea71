"""The instructor's overrides: ``grader serve override`` sets a student's score on an exercise with a reason; the
standings, the instructor's page and ``grades.csv`` show the overridden score, the override and its reason (the
total adjusted); clearing it restores the graded score; each one is in the audit log."""

from __future__ import annotations

import csv
import io
import json

from grader import cli
from grader.serve import audit, overrides, tokens
from grader.serve.db import Database

from . import serve_helpers as helpers


def _serve(capsys, folder, *args: str) -> tuple[int, str]:
    status = cli.main(["serve", *args, "--dir", str(folder)])
    return status, capsys.readouterr().err


def _csv(body: bytes) -> dict[str, dict[str, str]]:
    return {r["student"]: r for r in csv.DictReader(io.StringIO(body.decode()))}


def test_an_override_shows_with_its_reason_in_the_gradebook_and_can_be_cleared(tmp_path, capsys):
    folder = tmp_path / "serve-dir"
    helpers.add_students(folder, "alice", "bob")
    instructor = tokens.instructor_token(Database.in_folder(folder))
    reason = "kernel crashed on the grader's GPU driver; graded by hand"
    status, err = _serve(capsys, folder, "override", "alice", "gelu", "7.5", "--reason", reason)
    assert status == 0 and "alice's gelu override set to 7.5" in err, err
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), start_workers=False) as server:
        status, body = helpers.http(server.url + "/instructor/grades.csv", token=instructor)
        assert status == 200
        rows = _csv(body)
        assert rows["alice"]["gelu"] == "7.5" and rows["alice"]["total"] == "7.5"  # the grader's points format
        assert rows["alice"]["overrides"] == "gelu: 7.5" and rows["alice"]["override_reasons"] == f"gelu: {reason}"
        assert "bob" not in rows  # nothing graded, nothing overridden
        standings = json.loads(helpers.http(server.url + "/api/instructor/students", token=instructor)[1])
        assert {s["student"]: s["overrides"] for s in standings["students"]} == {
            "alice": {"gelu": {"score": 7.5, "reason": reason}}, "bob": {}}
        page = helpers.http(server.url + "/instructor", token=instructor)[1].decode()
        assert "gelu: 7.5 (kernel crashed on the grader&#x27;s GPU driver; graded by hand)" in page

        status, err = _serve(capsys, folder, "override", "alice", "gelu", "clear", "--reason", "driver fixed")
        assert status == 0, err
        rows = _csv(helpers.http(server.url + "/instructor/grades.csv", token=instructor)[1])
        assert "alice" not in rows
    entries = audit.entries(Database.in_folder(folder), action="override")
    assert [e.detail for e in entries] == [f"gelu: 7.5 ({reason})", "gelu: cleared (driver fixed)"]


def test_an_override_is_refused_without_a_reason_or_for_an_unknown_exercise_or_student(tmp_path, capsys):
    folder = tmp_path / "serve-dir"
    helpers.add_students(folder, "alice")
    for args, message in (
            (("alice", "gelu", "5", "--reason", "  "), "an override needs a reason"),
            (("alice", "nope", "5", "--reason", "x"), "unknown exercise 'nope'"),
            (("mallory", "gelu", "5", "--reason", "x"), "mallory is not on the roster"),
            (("alice", "gelu", "five", "--reason", "x"), "SCORE is a number of points or 'clear'"),
            (("alice", "gelu", "-1", "--reason", "x"), "a score is at least 0")):
        status, err = _serve(capsys, folder, "override", *args)
        assert status == 2 and message in err, (args, err)
    assert overrides.current(Database.in_folder(folder)) == {}


def test_an_override_replaces_a_graded_score_and_adjusts_the_total(tmp_path):
    gradebook = tmp_path / "grades.csv"
    gradebook.write_text("student,total,max_total,gelu,softmax,gelu_status,source\n"
                         "alice,12.00,20.00,4.00,8.00,graded,#1\nbob,3.00,20.00,3.00,,graded,#2\n")
    in_force = {"alice": {"gelu": overrides.Override("alice", "gelu", 9.0, "late exam accommodation", 0.0)}}
    overrides.apply_to_csv(gradebook, in_force)
    rows = _csv(gradebook.read_bytes())
    assert (rows["alice"]["gelu"], rows["alice"]["softmax"], rows["alice"]["total"]) == ("9", "8.00", "17")
    assert rows["alice"]["override_reasons"] == "gelu: late exam accommodation"
    assert rows["bob"] == {"student": "bob", "total": "3.00", "max_total": "20.00", "gelu": "3.00", "softmax": "",
                           "gelu_status": "graded", "source": "#2", "overrides": "", "override_reasons": ""}
