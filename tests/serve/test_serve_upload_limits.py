"""Uploads refused before their body is read: a declared size over the limit (413), a student over the hourly limit
or with too many waiting (429), a full queue (429), and a second upload of a student while one is being received
(429) — each with a message that names the limit, and without the multipart parser or the intake ever running."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest
from starlette.requests import Request

from grader.handin import client
from grader.serve import intake, queue
from grader.serve import policy as policy_mod
from grader.serve import upload as upload_mod

from . import serve_helpers as helpers


@pytest.fixture
def parsed(monkeypatch):
    """Every call of the multipart parser and of the intake, recorded (they still run)."""
    calls: list[str] = []
    form, accept = Request.form, intake.accept

    def recording_form(self, *args, **kwargs):
        calls.append("form")
        return form(self, *args, **kwargs)

    def recording_accept(*args, **kwargs):
        calls.append("accept")
        return accept(*args, **kwargs)

    monkeypatch.setattr(Request, "form", recording_form)
    monkeypatch.setattr(intake, "accept", recording_accept)
    return calls


def _server(tmp_path, **limits):
    rules = policy_mod.Policy(**{"submissions_per_hour": 100, "queued_per_student": 10, **limits})
    return helpers.in_process_server(tmp_path / "serve-dir", helpers.SleepingStandInBackend(), policy=rules,
                                     start_workers=False)


def _post(server, token: str, path, *, declared: int | None = None) -> tuple[int, dict, dict]:
    """POST an upload; with ``declared``, only the headers, claiming that Content-Length (no body is sent)."""
    body, content_type = client.multipart(path.name, path.read_bytes())
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(server.url).netloc, timeout=30)
    conn.putrequest("POST", "/api/submissions")
    for name, value in (("Authorization", f"Bearer {token}"), ("Content-Type", content_type),
                        ("Content-Length", str(declared if declared is not None else len(body)))):
        conn.putheader(name, value)
    conn.endheaders(None if declared is not None else body)
    response = conn.getresponse()
    data = json.loads(response.read())
    conn.close()
    return response.status, data, dict(response.getheaders())


def test_a_declared_size_over_the_limit_is_refused_with_413_before_the_body_is_read(tmp_path, parsed):
    upload = helpers.gelu_zip(tmp_path / "a.zip")
    with _server(tmp_path) as server:
        token = helpers.add_students(server.service.folder, "alice")["alice"]
        status, data, _ = _post(server, token, upload, declared=upload_mod.UPLOAD_MAX_BODY + 1)
    assert status == 413 and f"the limit is {intake.MAX_UPLOAD_BYTES >> 20} MB" in data["error"]
    assert parsed == []


def test_a_student_over_the_hourly_limit_gets_429_naming_it_before_the_body_is_read(tmp_path, parsed):
    upload = helpers.gelu_zip(tmp_path / "a.zip")
    with _server(tmp_path, submissions_per_hour=1) as server:
        token = helpers.add_students(server.service.folder, "alice")["alice"]
        status, data, _ = _post(server, token, upload)
        assert status == 201, data
        assert parsed == ["form", "accept"]
        parsed.clear()
        status, data, headers = _post(server, token, upload)
    assert status == 429 and "at most 1 submissions an hour" in data["error"] and int(headers["retry-after"]) > 0
    assert parsed == []


def test_too_many_waiting_or_a_full_queue_is_refused_before_the_body_is_read(tmp_path, parsed):
    upload = helpers.gelu_zip(tmp_path / "a.zip")
    with _server(tmp_path, queued_per_student=1, queued_total=2) as server:
        found = helpers.add_students(server.service.folder, "alice", "bob", "carol")
        assert _post(server, found["alice"], upload)[0] == 201
        assert _post(server, found["bob"], upload)[0] == 201
        parsed.clear()
        status, data, _ = _post(server, found["alice"], upload)
        assert status == 429 and "1 submission(s) waiting already (at most 1)" in data["error"]
        status, data, _ = _post(server, found["carol"], upload)
        assert status == 429 and "the queue is full (2 submissions waiting, at most 2)" in data["error"]
    assert parsed == []


def test_one_upload_in_flight_per_student(tmp_path, parsed):
    upload = helpers.gelu_zip(tmp_path / "a.zip")
    with _server(tmp_path) as server:
        found = helpers.add_students(server.service.folder, "alice", "bob")
        with upload_mod._one_upload(server.service, "alice"):  # alice's first upload is being received
            status, data, _ = _post(server, found["alice"], upload)
            assert status == 429 and "upload in progress already" in data["error"]
            assert parsed == []
            assert _post(server, found["bob"], upload)[0] == 201  # another student is not held up
        assert server.service.uploading == set()
        assert _post(server, found["alice"], upload)[0] == 201  # once it is over, the next one is taken
        assert server.service.uploading == set()  # and released after it


def test_the_queue_checks_its_room_again_when_it_enqueues(tmp_path):
    """The pre-check is advisory; enqueue's own check, in the transaction, is the one that holds under a race."""
    with _server(tmp_path, queued_total=1) as server:
        helpers.add_students(server.service.folder, "alice", "bob")
        db, rules = server.service.db, server.service.policy
        queue.enqueue(db, student="alice", filename="a.zip", kind="zip", size=1, exercises=["gelu"], late=[],
                      policy=rules)
        with pytest.raises(queue.Refused, match="the queue is full"):
            queue.enqueue(db, student="bob", filename="b.zip", kind="zip", size=1, exercises=["gelu"], late=[],
                          policy=rules)
