"""The token lifecycle from the command line: reissue a student's token, revoke it, remove a dropped student, rotate
the instructor's token — each effective at once on the API (and on a logged-in web session), tokens stored as
hashes only, and a removed student's submissions kept as history but out of the gradebook."""

from __future__ import annotations

import urllib.parse

import pytest

from grader import cli
from grader.serve import gradebook, queue, tokens
from grader.serve.backend import Job
from grader.serve.db import Database
from grader.serve.records import FAILED, QUEUED

from . import serve_helpers as helpers


def _serve(capsys, folder, *args: str) -> tuple[int, str, str]:
    status = cli.main(["serve", *args, "--dir", str(folder)])
    out, err = capsys.readouterr()
    return status, out, err


def _token_of(out: str) -> str:
    return out.strip().split("\t")[1] if "\t" in out else out.strip().rsplit(" ", 1)[1]


def _me(url: str, token: str) -> int:
    return helpers.http(url + "/api/submissions", token=token)[0]


def _session(url: str, token: str) -> str:
    """A logged-in web session's cookie value (the login form, as a browser posts it)."""
    import http.client

    conn = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=30)
    conn.request("POST", "/login", body=urllib.parse.urlencode({"token": token}),
                 headers={"Content-Type": "application/x-www-form-urlencoded", "Origin": url})
    response = conn.getresponse()
    assert response.status == 303, response.read()
    cookie = response.getheader("set-cookie") or ""
    return cookie.split(";", 1)[0].split("=", 1)[1]


def _with_cookie(url: str, session: str) -> int:
    return helpers.http(url + "/me", headers={"Cookie": f"grader_session={session}"})[0]


@pytest.fixture
def roster(tmp_path, capsys):
    folder = tmp_path / "serve-dir"
    found = {}
    for student in ("alice", "bob"):
        status, out, err = _serve(capsys, folder, "roster", "add", student)
        assert status == 0, err
        found[student] = _token_of(out)
    status, out, err = _serve(capsys, folder, "instructor-token")
    assert status == 0, err
    found["instructor"] = _token_of(out)
    return folder, found


def test_reissue_prints_a_new_token_and_the_old_one_and_its_session_stop_working_at_once(roster, capsys):
    folder, found = roster
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), start_workers=False) as server:
        session = _session(server.url, found["alice"])
        assert _me(server.url, found["alice"]) == 200 and _with_cookie(server.url, session) == 200
        status, out, err = _serve(capsys, folder, "roster", "reissue", "alice")
        assert status == 0, err
        assert out.startswith("alice\t") and "the old one no longer works" in err
        new = _token_of(out)
        assert new != found["alice"] and new.startswith(tokens.TOKEN_PREFIX)
        assert _me(server.url, found["alice"]) == 401
        assert _with_cookie(server.url, session) == 401  # the browser logged in with the old token is out too
        assert _me(server.url, new) == 200
        assert _me(server.url, found["bob"]) == 200  # nobody else's token changed
    stored = [r["hash"] for r in Database.in_folder(folder).query("SELECT hash FROM tokens")]
    assert tokens.token_hash(new) in stored and new not in stored  # only hashes are kept


def test_revoke_stops_the_token_with_no_new_one_until_a_reissue(roster, capsys):
    folder, found = roster
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), start_workers=False) as server:
        status, out, err = _serve(capsys, folder, "roster", "revoke", "bob")
        assert status == 0 and out == "" and "1 token(s) of bob revoked" in err
        assert _me(server.url, found["bob"]) == 401
        status, out, err = _serve(capsys, folder, "roster", "reissue", "bob")
        assert status == 0, err
        assert _me(server.url, _token_of(out)) == 200


def test_remove_keeps_the_history_marked_removed_and_leaves_the_gradebook(roster, capsys, tmp_path):
    folder, found = roster
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), start_workers=False) as server:
        for _ in range(2):
            status, data = helpers.upload(server.url, found["bob"], helpers.gelu_zip(tmp_path / "bob.zip"))
            assert status == 201, data
        db = server.service.db
        graded = queue.claim_next(db)
        grade, times = server.service.backend.grade(Job(graded, tmp_path / "bob.zip", tmp_path))
        assert queue.finish(db, graded, grade, times)
        assert [s.student for s in gradebook.standings(db)] == ["alice", "bob"]

        status, out, err = _serve(capsys, folder, "roster", "remove", "bob")
        assert status == 0 and "1 queued submission(s) will not be graded" in err, err
        assert _me(server.url, found["bob"]) == 401
        assert [s.student for s in gradebook.standings(db)] == ["alice"]
        history = queue.of_student(db, "bob")
        assert [s.status for s in history] == [FAILED, "done"]  # kept; the queued one is not graded
        assert "removed from the roster" in history[0].message and not any(s.status == QUEUED for s in history)
        status, body = helpers.http(server.url + "/api/submissions", token=found["instructor"])
        assert status == 200 and b'"student_removed":true' in body
        status, body = helpers.http(server.url + "/instructor", token=found["instructor"])
        assert status == 200 and b"bob (removed)" in body

    status, out, err = _serve(capsys, folder, "roster", "list")
    assert out.split() == ["alice"]
    status, out, err = _serve(capsys, folder, "roster", "list", "--removed")
    assert "bob\t\tremoved" in out
    status, out, err = _serve(capsys, folder, "roster", "add", "bob")
    assert status == 2 and "bob was removed from the roster" in err
    status, out, err = _serve(capsys, folder, "roster", "reissue", "bob")
    assert status == 2 and "bob was removed from the roster" in err
    status, out, err = _serve(capsys, folder, "roster", "revoke", "nobody")
    assert status == 2 and "nobody is not on the roster" in err


def test_rotating_the_instructor_token_revokes_every_earlier_one_at_once(roster, capsys):
    folder, found = roster
    with helpers.in_process_server(folder, helpers.SleepingStandInBackend(), start_workers=False) as server:
        status, out, err = _serve(capsys, folder, "instructor-token")  # a second one: both valid
        assert status == 0, err
        second = _token_of(out)
        assert helpers.http(server.url + "/api/instructor/students", token=second)[0] == 200
        status, out, _err = _serve(capsys, folder, "instructor-token", "--rotate")
        assert status == 0 and "every earlier one is revoked" in out
        rotated = _token_of(out)
        for old in (found["instructor"], second):
            assert helpers.http(server.url + "/api/instructor/students", token=old)[0] == 401
        assert helpers.http(server.url + "/api/instructor/students", token=rotated)[0] == 200
        assert _me(server.url, found["alice"]) == 200  # students' tokens are untouched
