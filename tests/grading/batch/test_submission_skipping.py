"""Students hand in whole clones: what cannot be student code (virtual environments, build output, big data files)
is left out of a directory or zip, never copied nor unpacked, and named in a note that reaches the report and
``grader status``; the file-count and size limits apply to what is kept, and a zip bomb is still refused."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from grader import cli, exercises
from grader.checks import loader
from grader.grading.batch import submission
from grader.grading.commands import grade as grade_cmd
from grader.grading.commands import status as status_mod
from grader.serve import db as db_mod
from grader.serve import intake, policy, tokens

from ...sandboxing import sandbox_args

ALL = exercises.all_exercises()
GELU = exercises.get("gelu")
SOURCE = "def gelu(x):\n    return x\n"
VENV_FILES = 5001  # one more than the limit on files: the .venv alone used to refuse the submission


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that costs no disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def _clone(root: Path) -> Path:
    """A student's whole clone: the kernel, a virtual environment, a data file, build output, a named env."""
    (root / "gelu").mkdir(parents=True)
    (root / "gelu" / "gelu.py").write_text(SOURCE)
    site = root / ".venv" / "lib" / "python3.11" / "site-packages" / "torch"
    site.mkdir(parents=True)
    for i in range(VENV_FILES):
        (site / f"m{i}.py").touch()
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / ".venv" / "bin").mkdir()
    (root / ".venv" / "bin" / "python").symlink_to("/usr/bin/python3")  # every venv has links: none is reported
    _sparse(root / "data" / "big.bin", 70 << 20)
    (root / "env").mkdir()
    (root / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "build" / "lib").mkdir(parents=True)
    (root / "build" / "lib" / "gelu.py").write_text("stale = True\n")
    (root / "course.egg-info").mkdir()
    (root / "course.egg-info" / "PKG-INFO").write_text("Name: course\n")
    (root / "gelu" / "__pycache__").mkdir()
    (root / "gelu" / "__pycache__" / "gelu.cpython-311.pyc").write_bytes(b"x")
    (root / "notes.md").write_text("my notes\n")
    return root


def _zip(folder: Path, path: Path, *, compression: int = zipfile.ZIP_STORED) -> Path:
    """``folder`` zipped under its own name, links kept as links (as ``zip -y`` does)."""
    with zipfile.ZipFile(path, "w", compression) as zf:
        for parent, dirs, files in os.walk(folder):
            for name in sorted(dirs + files):
                item = Path(parent, name)
                arcname = f"{folder.name}/{item.relative_to(folder).as_posix()}"
                if item.is_symlink():
                    info = zipfile.ZipInfo(arcname)
                    info.external_attr = 0o120777 << 16
                    zf.writestr(info, os.readlink(item))
                elif item.is_file():
                    zf.write(item, arcname)
    return path


def _bytes_under(folder: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("kind", ["directory", "zip"])
def test_a_whole_clone_is_graded_and_the_note_names_what_was_skipped(tmp_path, kind):
    source = _clone(tmp_path / "alice")
    if kind == "zip":
        source = _zip(source, tmp_path / "alice.zip")
    work = tmp_path / "work"
    sub = submission.prepare(source, work, ALL)
    assert sub.usable and sub.student == "alice" and sub.kind == kind
    assert loader.load(sub.root, GELU, ("gelu",)).gelu(3) == 3  # the kernel module is there to grade
    top = "alice/" if kind == "zip" else ""
    assert sub.problems == [
        f"skipped (not student code, not graded): {top}.venv/ ({VENV_FILES + 2} files), {top}build/ (1 file), "
        f"{top}course.egg-info/ (1 file), {top}env/ (1 file), {top}data/big.bin (70 MB: over the 1 MB bound for a "
        "file)"
    ]
    kept = sorted(p.relative_to(sub.root).as_posix() for p in sub.root.rglob("*") if p.is_file())
    assert kept == ["gelu/gelu.py", "notes.md"]
    assert _bytes_under(work) < 1 << 20  # the 70 MB file was neither copied nor unpacked


def test_env_is_left_out_only_when_it_is_a_virtual_environment(tmp_path):
    root = tmp_path / "bob"
    (root / "gelu").mkdir(parents=True)
    (root / "gelu" / "gelu.py").write_text(SOURCE)
    (root / "env").mkdir()
    (root / "env" / "settings.py").write_text("DEBUG = True\n")  # a student's own package called env
    (root / "myenv").mkdir()
    (root / "myenv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    sub = submission.prepare(root, tmp_path / "work", ALL)
    assert (sub.root / "env" / "settings.py").is_file() and not (sub.root / "myenv").exists()
    assert sub.problems == ["skipped (not student code, not graded): myenv/ (1 file)"]


def test_an_exercise_module_is_never_left_out_for_its_size(tmp_path):
    root = tmp_path / "carol"
    (root / "gelu").mkdir(parents=True)
    (root / "gelu" / "gelu.py").write_text(SOURCE + "# " + "x" * (2 << 20) + "\n")  # 2 MB: a generated table
    sub = submission.prepare(root, tmp_path / "work", ALL)
    assert (sub.root / "gelu" / "gelu.py").stat().st_size > 2 << 20 and sub.problems == []


def test_too_many_kept_files_are_refused_naming_the_limit_and_where_they_are(tmp_path):
    root = tmp_path / "dave"
    (root / "gelu").mkdir(parents=True)
    (root / "gelu" / "gelu.py").write_text(SOURCE)
    for folder, count in (("frames", 3000), ("masks", 2500), ("labels", 10)):
        (root / "data" / folder).mkdir(parents=True)
        for i in range(count):
            (root / "data" / folder / f"{i}.png").touch()
    (root / ".venv").mkdir()
    (root / ".venv" / "x.py").touch()
    sub = submission.prepare(root, tmp_path / "work", ALL)
    assert not sub.usable
    assert sub.problems == [
        "skipped (not student code, not graded): .venv/ (1 file)",
        "dave: more than the limit of 5000 files to grade (5511 kept); most are in data/frames/ (3000 files, "
        "0 bytes), data/masks/ (2500 files, 0 bytes), data/labels/ (10 files, 0 bytes)",
    ]


@pytest.mark.parametrize("kind", ["directory", "zip"])
def test_too_many_kept_bytes_are_refused_naming_the_limit_and_the_largest(tmp_path, kind):
    root = tmp_path / "erin"
    (root / "gelu").mkdir(parents=True)
    (root / "gelu" / "gelu.py").write_text(SOURCE)
    for i in range(70):  # each under the bound for a file, together over the limit
        _sparse(root / "weights" / f"w{i:02}.bin", 1 << 20)
    (root / "src").mkdir()
    (root / "src" / "helpers.py").write_text("X = 1\n")
    source = root if kind == "directory" else _zip(root, tmp_path / "erin.zip")
    sub = submission.prepare(source, tmp_path / "work", ALL)
    assert not sub.usable
    top = "erin/" if kind == "zip" else ""
    name = "erin" if kind == "directory" else "erin.zip"
    assert sub.problems == [
        f"{name}: more than the limit of 64 MB to grade (70 MB kept); the largest: {top}weights/ (70 files, 70 MB), "
        f"{top}gelu/ (1 file, 26 bytes), {top}src/ (1 file, 6 bytes)"
    ]


def test_a_zip_bomb_is_refused_and_nothing_is_unpacked(tmp_path):
    bomb = tmp_path / "frank.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("gelu/gelu.py", SOURCE)
        with zf.open("zeros.bin", "w", force_zip64=True) as f:
            chunk = bytes(1 << 20)
            for _ in range(65):
                f.write(chunk)
    work = tmp_path / "work"
    sub = submission.prepare(bomb, work, ALL)
    assert not sub.usable
    assert sub.problems == [
        "frank.zip: a zip bomb (it would unpack to 65 MB, more than 100 times its size): not unpacked"
    ]
    assert not any(p.is_file() for p in work.rglob("*"))


def test_outside_paths_and_links_are_still_skipped_next_to_what_is_left_out(tmp_path):
    path = tmp_path / "gina.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("gina/gelu/gelu.py", SOURCE)
        zf.writestr("../../evil.py", "print('escaped')")
        zf.writestr("gina/venv/lib/x.py", "")
        link = zipfile.ZipInfo("gina/link")
        link.external_attr = 0o120777 << 16
        zf.writestr(link, "/etc/passwd")
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert sub.usable and not (tmp_path / "evil.py").exists() and not (sub.root / "link").exists()
    assert sub.problems == [
        "../../evil.py: path outside the archive (skipped)",
        "gina/link: symbolic links are not graded (skipped)",
        "skipped (not student code, not graded): gina/venv/ (1 file)",
    ]


def test_an_upload_says_what_was_skipped(tmp_path):
    upload = tmp_path / "upload.zip"
    with zipfile.ZipFile(upload, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("harry/assignments/gelu/gelu.py", SOURCE)
        for i in range(VENV_FILES):
            zf.writestr(f"harry/node_modules/m{i}.js", "")
    database = db_mod.Database.in_folder(tmp_path / "serve-dir")
    tokens.add_student(database, "harry")
    accepted = intake.accept(
        database,
        folder=tmp_path / "serve-dir",
        student="harry",
        filename="harry.zip",
        data_file=upload,
        size=upload.stat().st_size,
        policy=policy.Policy(submissions_per_hour=100, queued_per_student=100),
        selected=(GELU,),
    )
    assert accepted.exercises == ["gelu"]
    assert accepted.problems == [f"skipped (not student code, not graded): harry/node_modules/ ({VENV_FILES} files)"]


def test_the_note_and_the_refusal_reach_the_report_and_grader_status(tmp_path):
    bare = tmp_path / "subs" / "ivan"  # a clone whose kernels were never written: nothing to grade
    bare.mkdir(parents=True)
    _sparse(bare / "data" / "big.bin", 70 << 20)
    over = tmp_path / "subs" / "jane"
    (over / "gelu").mkdir(parents=True)
    (over / "gelu" / "gelu.py").write_text(SOURCE)
    for i in range(70):
        _sparse(over / "weights" / f"w{i:02}.bin", 1 << 20)
    out = tmp_path / "out"
    args = [
        "grade",
        str(bare),
        str(over),
        "--out",
        str(out),
        "--exercises",
        "gelu",
        "--random",
        "0",
        "--secret",
        "s",
        *sandbox_args(),
    ]
    assert cli.main(args) == grade_cmd.EXIT_UNGRADABLE
    note = "skipped (not student code, not graded): data/big.bin (70 MB: over the 1 MB bound for a file)"
    limit = "jane: more than the limit of 64 MB to grade (70 MB kept); the largest: weights/ (70 files, 70 MB)"
    assert f"> Submission problem: {note}" in (out / "students" / "ivan" / "report.md").read_text()
    assert f"> Submission problem: {limit}" in (out / "students" / "jane" / "report.md").read_text()
    ungradable = status_mod.collect(out)["ungradable"]
    assert ungradable["ivan"].startswith(note + "; ivan: no exercise module found")
    assert ungradable["jane"].startswith(limit)


def test_grader_submit_leaves_out_of_an_upload_what_the_grader_would_leave_out(tmp_path):
    """A student's whole clone fits the server's upload limit: the client zips the kernels, not the environment."""
    import io
    import zipfile

    from grader.handin import client

    clone = tmp_path / "clone"
    (clone / "gelu").mkdir(parents=True)
    (clone / "gelu" / "gelu.py").write_text("def gelu(x):\n    return x\n")
    (clone / "myenv" / "lib").mkdir(parents=True)
    (clone / "myenv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (clone / "myenv" / "lib" / "torch.so").write_bytes(b"\0" * 10)
    (clone / "node_modules").mkdir()
    (clone / "node_modules" / "x.js").write_text("x")
    with open(clone / "data.bin", "wb") as big:
        big.truncate(70 << 20)  # sparse: over the server's 64 MB alone
    names = zipfile.ZipFile(io.BytesIO(client.zip_folder(clone))).namelist()
    assert names == ["clone/gelu/gelu.py"]
