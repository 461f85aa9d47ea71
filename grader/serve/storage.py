"""The serve folder's files (the database and the secret beside them)::

    SERVE_DIR/serve.sqlite3                  the database (grader.serve.db)
    SERVE_DIR/secret.txt                     the secret that seeds the hidden cases (mode 600)
    SERVE_DIR/course.toml                    the course file the engine grades with, without [serve] (if needed)
    SERVE_DIR/submissions/<id>/upload/<student>.zip|.ipynb   what the student handed in
    SERVE_DIR/submissions/<id>/attempt-<n>/  a grading output folder (grader grade's layout)
    SERVE_DIR/submissions/<id>/attempt-<n>.log   the grader's output for that attempt
"""

from __future__ import annotations

import secrets
from pathlib import Path

from grader.grading.results import store
from grader.serve.records import Submission

SECRET = "secret.txt"
EXTENSIONS = {"zip": ".zip", "notebook": ".ipynb"}


def submission_dir(folder: Path, submission_id: int) -> Path:
    return folder / "submissions" / str(int(submission_id))


def upload_path(folder: Path, submission: Submission) -> Path:
    # named after the roster id: the engine takes a submission's student id from its file name
    return submission_dir(folder, submission.id) / "upload" / f"{submission.student}{EXTENSIONS[submission.kind]}"


def secret(folder: Path) -> str:
    """The serve folder's secret, made on first use: every submission is graded on the same hidden cases."""
    kept = store.read_secret(folder)
    if kept:
        return kept
    value = secrets.token_hex(16)
    store.write_secret(folder, value)
    return value
