"""The sandbox's scratch space is bounded: a worker's /tmp is a sized tmpfs where the bwrap has ``--size``, nothing
else in the sandbox is writable, and a full scratch is told to the student as such."""

from __future__ import annotations

import dataclasses
import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from grader.checks import scratch
from grader.grading.isolation import bwrap, worker
from tests.sandboxing import require_sandbox


def _binds(tmp_path: Path) -> list[bwrap.Bind]:
    return bwrap.worker_binds(submission=tmp_path, package=tmp_path, scratch=tmp_path / "scratch", triton_cache=None)


def test_a_bwrap_with_size_gets_a_sized_tmpfs_at_tmp(tmp_path):
    box = bwrap.Sandbox("bwrap", (0, 11, 0), (), scratch_bytes=3 * bwrap.GiB)
    argv = box.command(["python"], binds=_binds(tmp_path), env={}, cwd="/tmp")
    at = argv.index("/tmp", argv.index("--tmpfs"))
    assert argv[at - 3:at + 1] == ["--size", str(3 * bwrap.GiB), "--tmpfs", "/tmp"]
    assert str(tmp_path / "scratch") not in argv  # the host folder is not shown: nothing lands on the disk
    assert argv[argv.index("/dev/shm") - 3:argv.index("/dev/shm")] == ["--size", str(bwrap.SHM_BYTES), "--tmpfs"]
    assert argv[argv.index("--setenv", argv.index(bwrap.SCRATCH_VAR) - 1) + 2] == str(3 * bwrap.GiB)
    # bwrap's own tmpfs (the root, /dev) are made read-only after every mount point is made
    assert argv[argv.index("--remount-ro"):][:4] == ["--remount-ro", "/dev", "--remount-ro", "/"]
    assert argv.index("--remount-ro") > at


def test_a_bwrap_without_size_binds_the_host_folder(tmp_path):
    box = bwrap.Sandbox("bwrap", (0, 6, 0), ())
    argv = box.command(["python"], binds=_binds(tmp_path), env={}, cwd="/tmp")
    assert "--size" not in argv and bwrap.SCRATCH_VAR not in argv
    at = argv.index(str(tmp_path / "scratch"))
    assert argv[at - 1:at + 2] == ["--bind", str(tmp_path / "scratch"), "/tmp"]


def test_masks_over_protected_folders_are_read_only(tmp_path):
    mask = bwrap.Bind("", "/usr/hidden", "tmpfs")
    argv = bwrap.Sandbox("bwrap", (0, 11, 0), (bwrap.Bind("/usr", "/usr"), mask)).command(
        ["python"], binds=[], env={}, cwd="/tmp")
    assert argv.index("--tmpfs") < argv.index("--remount-ro")
    assert argv[argv.index("--remount-ro") + 1] == "/usr/hidden"


def _fake_bwrap(folder: Path, help_text: str) -> Path:
    """A bwrap that says its version and help, and runs the check's probe as if sandboxed."""
    folder.mkdir()
    fake = folder / "bwrap"
    fake.write_text("#!/bin/sh\n"
                    "[ \"$1\" = --version ] && echo 'bubblewrap 0.6.0' && exit 0\n"
                    f"[ \"$1\" = --help ] && printf '%s\\n' '{help_text}' && exit 0\n"
                    "echo sandbox 65534\n")
    fake.chmod(0o755)
    return fake


def test_the_check_detects_size_and_warns_once_where_it_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bwrap, "_warned_unbounded", set())
    old = _fake_bwrap(tmp_path / "old", "    --tmpfs DEST                 Mount new tmpfs on DEST")
    for _ in range(2):
        found = bwrap.check("cpu", bwrap=str(old))
        assert found.sandbox is not None and found.sandbox.scratch_bytes is None
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and f"{old} has no --size option" in err and "no bound" in err
    sized = _fake_bwrap(tmp_path / "new", "    --size BYTES        Set size of next argument (only for --tmpfs)")
    found = bwrap.check("cpu", bwrap=str(sized))
    assert found.sandbox is not None and found.sandbox.scratch_bytes == bwrap.SCRATCH_BYTES
    assert found.sandbox.description == "a bubblewrap 0.6.0 sandbox (/tmp of 2 GiB)"  # what every report says
    assert bwrap.Sandbox("bwrap", (0, 6, 0), (), "the system's bwrap").description == (
        "a bubblewrap 0.6.0 sandbox (the system's bwrap; /tmp unbounded: this bwrap has no --size)")
    assert capsys.readouterr().err == ""


def test_a_full_scratch_is_told_as_such():
    full = OSError(errno.ENOSPC, "No space left on device")
    assert scratch.scratch_note(full, str(2 * bwrap.GiB)) == (
        "the sandbox's scratch space (2 GiB) is full: write less to /tmp (or TMPDIR, HOME)")
    try:
        try:
            raise full
        except OSError as exc:
            raise RuntimeError("saving failed") from exc
    except RuntimeError as chained:
        assert scratch.scratch_note(chained, str(bwrap.GiB // 2)).startswith("the sandbox's scratch space (0.5 GiB)")
    assert scratch.scratch_note(OSError(errno.EACCES, "Permission denied"), "1") is None
    assert scratch.scratch_note(ValueError("x"), "1") is None


def test_the_worker_says_the_scratch_is_full(monkeypatch):
    monkeypatch.setenv(bwrap.SCRATCH_VAR, str(bwrap.GiB))
    text = worker._describe(OSError(errno.ENOSPC, "No space left on device"))
    assert text.startswith("OSError: [Errno 28]") and "the sandbox's scratch space (1 GiB) is full" in text


WRITE = r'''
import errno, json, os
seen = {"bound": os.environ.get("GRADER_SCRATCH_BYTES")}
try:
    with open("/tmp/big", "wb") as f:
        for _ in range(16):
            f.write(b"x" * (1 << 20))
    seen["tmp"] = "done"
except OSError as exc:
    seen["tmp"] = errno.errorcode[exc.errno]
for folder in ("/", "/dev", "/sandbox"):
    try:
        open(os.path.join(folder, "probe"), "w").close()
        seen[folder] = "done"
    except OSError as exc:
        seen[folder] = errno.errorcode[exc.errno]
print(json.dumps(seen))
'''


def test_a_sandboxed_write_beyond_the_bound_fails_with_enospc(tmp_path):
    box = require_sandbox()
    if box.scratch_bytes is None:
        pytest.skip(f"{box.bwrap} has no --size: the scratch cannot be bounded here")
    small = dataclasses.replace(box, scratch_bytes=4 << 20)  # 16 MiB written, 4 MiB allowed
    (tmp_path / "scratch").mkdir()
    argv = small.command([sys.executable, "-I", "-c", WRITE], binds=_binds(tmp_path),
                         env={"PATH": "/usr/bin:/bin"}, cwd="/tmp")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"bound": str(4 << 20), "tmp": "ENOSPC", "/": "EROFS", "/dev": "EROFS", "/sandbox": "EROFS"}
    assert list((tmp_path / "scratch").iterdir()) == []  # nothing reached the host's disk


def test_a_check_whose_call_filled_the_scratch_says_so(monkeypatch):
    """A correctness case's exception text (``student_traceback``) carries the note too."""
    from grader.checks.student_errors import student_traceback

    monkeypatch.setenv(scratch.SCRATCH_VAR, str(2 * bwrap.GiB))
    text = student_traceback(OSError(errno.ENOSPC, "No space left on device"))
    assert "the sandbox's scratch space (2 GiB) is full" in text
    assert "scratch space" not in student_traceback(OSError(errno.EACCES, "Permission denied"))


def test_the_course_sizes_the_scratch_and_every_report_says_the_size(tmp_path):
    from types import SimpleNamespace

    from grader.grading import config
    from grader.grading.batch import context

    course = tmp_path / "course.toml"
    course.write_text("[grading]\nscratch_mb = 512\n")
    sized = bwrap.Sandbox("bwrap", (0, 11, 0), (), scratch_bytes=bwrap.SCRATCH_BYTES)
    work = SimpleNamespace(dir=tmp_path / "work", token="t")

    def made(options, box):
        return context.make_context(tmp_path / "out", options, secret="s", work=work, device="cpu",
                                    sandbox=(box, f"in {box.description}"))

    ctx = made(config.GradeOptions(course=course), sized)
    assert ctx.settings.sandbox.scratch_bytes == 512 << 20
    assert ctx.sandbox_note == "in a bubblewrap 0.11.0 sandbox (/tmp of 0.5 GiB)"
    default = made(config.GradeOptions(), sized)
    assert default.settings.sandbox.scratch_bytes == 2048 << 20 == bwrap.SCRATCH_BYTES
    unsized = bwrap.Sandbox("bwrap", (0, 6, 0), ())  # no --size: nothing to size, and said so
    assert made(config.GradeOptions(course=course), unsized).settings.sandbox.scratch_bytes is None
    course.write_text("[grading]\nscratch_mb = 0\n")
    with pytest.raises(config.CourseError, match="scratch_mb must be positive"):
        config.load_course(course)
