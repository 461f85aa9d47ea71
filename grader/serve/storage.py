"""The serve folder's files (the database and the secret beside them)::

    SERVE_DIR/serve.sqlite3                  the database (grader.serve.db)
    SERVE_DIR/secret.txt                     the secret that seeds the hidden cases (mode 600)
    SERVE_DIR/course.toml                    the course file the engine grades with, without [serve] (if needed)
    SERVE_DIR/submissions/<id>/upload/<student>.zip|.ipynb   what the student handed in
    SERVE_DIR/submissions/<id>/attempt-<n>/  a grading output folder (grader grade's layout)
    SERVE_DIR/submissions/<id>/attempt-<n>.log   the grader's output for that attempt

Everything in it is the owner's only (folders 0700, files 0600): students' code, their grades and the token hashes
are nobody else's business on a shared machine. :func:`private_umask` covers what the server and its grading
children create; :func:`tighten` fixes a folder an earlier version made with the default modes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from grader.grading.results import store
from grader.serve.records import Submission

SECRET = "secret.txt"
PRIVATE_UMASK = 0o077  # no group or other bits on anything created
DIR_MODE, FILE_MODE = 0o700, 0o600
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


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Files and folders made inside (by this process or its children) are the owner's only. The umask is the
    process's: the server sets it for its whole life, which is what it wants."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def make_private_dir(path: Path) -> Path:
    """``path`` (and missing parents) as a folder of the owner's only, whatever the umask."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for made in reversed(missing):  # mkdir(parents=True) would give the parents the umask's mode
        made.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(made, DIR_MODE)
    os.chmod(path, DIR_MODE)
    return path


def tighten(folder: Path) -> list[Path]:
    """Remove group and other bits from ``folder`` and everything in it; returns what was changed (links are left
    alone: chmod would follow them out of the folder)."""
    changed = []
    for path in [folder, *folder.rglob("*")]:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode) or not info.st_mode & 0o077:
            continue
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o077)
        changed.append(path)
    return changed
