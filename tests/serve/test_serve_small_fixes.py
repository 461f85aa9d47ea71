"""Smaller things a course meets with ``grader serve``: the public default ``cases_seed`` is warned of; a manifest in
an upload (``student.toml``, a notebook's ``grader.student_id``) never grades it as another student; a refusal names
the file the student uploaded; ``grader submit`` suggests ``grader results`` with the token option; error pages link
back; a student's own leaderboard rows are marked."""

from __future__ import annotations

import json

import pytest

from grader import cli, exercises
from grader.grading import config
from grader.serve import policy as policy_mod
from grader.serve import queue, tokens
from grader.serve.db import Database

RULES = policy_mod.Policy(submissions_per_hour=100, queued_per_student=10)


def test_serve_warns_of_the_public_default_cases_seed(tmp_path):
    from grader.serve.serve_cli import public_seed_warning

    assert "cases_seed is the public default" in public_seed_warning(config.load_course())
    course = tmp_path / "course.toml"
    course.write_text('[grading]\ncases_seed = "a private one"\n')
    assert public_seed_warning(config.load_course(course)) is None


def test_a_manifest_in_an_upload_does_not_retitle_it_as_another_student(tmp_path):
    import zipfile

    from grader.grading.batch import submission
    from grader.serve.grade_one import without_manifest

    upload = tmp_path / "stored" / "alice.zip"
    upload.parent.mkdir()
    with zipfile.ZipFile(upload, "w") as zf:
        zf.writestr("assignments/gelu/gelu.py", "x = 1\n")
        zf.writestr("assignments/student.toml", 'student_id = "bob"\n')
    selected = tuple(e for e in exercises.all_exercises() if e.name == "gelu")
    assert submission.prepare(upload, tmp_path / "as-is", selected).student == "bob"  # what the engine would do
    (tmp_path / "graded").mkdir()
    graded = without_manifest(upload, tmp_path / "graded")
    assert graded.name == "alice.zip" and submission.prepare(graded, tmp_path / "p", selected).student == "alice"
    notebook = tmp_path / "stored" / "alice.ipynb"
    notebook.write_text(json.dumps({"cells": [], "metadata": {"grader": {"student_id": "bob"}}, "nbformat": 4,
                                    "nbformat_minor": 5}))
    graded = without_manifest(notebook, tmp_path / "graded")
    assert json.loads(graded.read_text())["metadata"] == {"grader": {}}


def test_a_refusal_names_the_uploaded_file_not_the_stored_one(tmp_path):
    from grader.serve import intake

    db = Database.in_folder(tmp_path / "serve-dir")
    tokens.add_student(db, "alice")
    data = tmp_path / "upload"
    data.write_bytes(b"not a zip")
    selected = tuple(e for e in exercises.all_exercises() if e.name == "gelu")
    with pytest.raises(queue.Refused) as refused:
        intake.accept(db, folder=tmp_path / "serve-dir", student="alice", filename="my-work.zip", data_file=data,
                      size=9, policy=RULES, selected=selected)
    assert "my-work.zip is not a valid zip file" in str(refused.value) and "alice.zip" not in str(refused.value)


def test_grader_submit_suggests_results_with_the_token_option(tmp_path, monkeypatch, capsys):
    from grader.handin import client

    monkeypatch.setattr(client, "submit", lambda server, path: {"id": 7, "status": "queued", "position": 1,
                                                                "exercises": ["gelu"]})
    token = tmp_path / "token.txt"
    token.write_text("t0ken\n")
    assert cli.main(["submit", "--server", "http://x", "--token-file", str(token), str(tmp_path)]) == 0
    assert f"grader results --server http://x --token-file {token} 7" in capsys.readouterr().out
    assert cli.main(["submit", "--server", "http://x", "--token", "secret", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "grader results --server http://x --token YOUR_TOKEN 7" in shown and "secret" not in shown


def test_the_error_page_links_back_and_the_leaderboard_marks_your_rows():
    from grader.serve import leaderboard, pages
    from grader.serve.records import Principal

    alice = Principal("student", "alice")
    assert '<a href="/" id="back">' in pages.error(alice, 413, "a form of at most 8192 bytes")
    board = leaderboard.Board("gelu", "forward", "n=1024", [
        leaderboard.Entry(1, "fast-one", 0.1, 2.0, "H200", "2025-10-01", False),
        leaderboard.Entry(2, "anon-3f2a", 0.2, 1.0, "H200", "2025-10-01", True)])
    html = pages.leaderboard(alice, [board], on_gpu=True, device="H200")
    assert "<tr class=mine><td>2</td><td>anon-3f2a <strong>(you)</strong></td>" in html
    assert "fast-one <strong>" not in html
