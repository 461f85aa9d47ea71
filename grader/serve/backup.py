"""A consistent copy of a serve folder, taken while the server runs, and its restore.

The database is copied with SQLite's online backup API (a snapshot of one moment, whatever the server writes
meanwhile), then the files: every upload the snapshot knows of is there, since an upload is stored before its
submission commits. A submission the snapshot shows running may have a half-written attempt folder: on the first
start after a restore it is queued again and graded from scratch, as after any stop. Left out: ``class/`` (rebuilt
on demand), ``references/`` and ``yardstick/`` (caches the grader computes or records again)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

from grader.serve import audit, db, storage

MANIFEST = "backup.json"
FILES = (storage.SECRET, "serve.json", "course.toml")  # copied when present
FOLDERS = ("submissions",)


class BackupError(RuntimeError):
    """A backup or restore that cannot be made (told verbatim)."""


def _copy_database(source: Path, target: Path) -> None:
    target.touch(mode=storage.FILE_MODE)
    src = sqlite3.connect(source, timeout=30.0)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)  # page by page, retried if the server writes meanwhile: one consistent snapshot
    finally:
        dst.close()
        src.close()


def _copy_files(source: Path, target: Path) -> None:
    for name in FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    for name in FOLDERS:
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name, symlinks=True)


def _empty_target(path: Path, what: str) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise BackupError(f"{path} exists and is not empty: {what} goes into a new or empty folder")


def backup(database: db.Database, folder: Path, out: Path, *, log: bool = True) -> dict:
    """Copy the serve folder ``folder`` into ``out`` (a new or empty folder, made the owner's only); returns the
    manifest written beside the copy. ``log``: record the backup in the audit log (which waits for the write lock)."""
    _empty_target(out, "a backup")
    storage.make_private_dir(out)
    _copy_database(database.path, out / db.FILE)
    _copy_files(folder, out)
    copy = db.Database(out / db.FILE)
    manifest = {"made": time.time(), "source": str(folder), "schema_version": db.VERSION,
                "submissions": copy.query("SELECT COUNT(*) AS n FROM submissions")[0]["n"],
                "students": copy.query("SELECT COUNT(*) AS n FROM students")[0]["n"]}
    copy.close()
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    storage.tighten(out)
    if log:
        audit.record(database, audit.CLI, "backup", str(out), f"{manifest['submissions']} submission(s)")
    return manifest


def restore(source: Path, folder: Path) -> dict:
    """Make ``folder`` (new or empty; the server stopped) a copy of the backup ``source``; returns its manifest."""
    manifest_path = source / MANIFEST
    if not manifest_path.is_file() or not (source / db.FILE).is_file():
        raise BackupError(f"{source} is not a grader serve backup (no {MANIFEST} and {db.FILE} in it)")
    _empty_target(folder, "a restore")
    manifest = json.loads(manifest_path.read_text())
    storage.make_private_dir(folder)
    _copy_database(source / db.FILE, folder / db.FILE)
    _copy_files(source, folder)
    storage.tighten(folder)
    restored = db.Database.in_folder(folder)  # checks the schema (a newer grader's backup is refused) and migrates
    audit.record(restored, audit.CLI, "restore", str(source), f"backup made {manifest.get('made')}")
    restored.close()
    return manifest
