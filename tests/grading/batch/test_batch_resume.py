"""Resumable, loss-free batches: a grader killed in the middle of a batch (SIGKILL, SIGTERM) leaves no process
and no half-written file behind; the same command then grades only what was unfinished and writes the same
gradebook as an uninterrupted run. A folder holding another batch (secret, course configuration, settings,
a submission's files) is refused with the difference named; a fault while recording one student's result
makes that exercise "needs regrade" and the batch goes on."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grader import cli
from grader.grading import config
from grader.grading.batch import markers, resume
from grader.grading.commands import grade as grade_cmd
from grader.grading.results import reports, store

from ... import sandboxing
from ...gates import until

REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO / "tests" / "submissions"
ARGS = ["--exercises", "gelu", "--random", "0", "--secret", "resume-secret", *sandboxing.sandbox_args()]

# Correct, but slow to import, and leaves a detached child behind: the kill lands while it runs.
DETACHED_MARKER = "time.sleep(600.25)"
SLOW_AND_DETACHING = f'''
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; {DETACHED_MARKER}"], start_new_session=True)
time.sleep(3)
'''


def _class(tmp: Path) -> list[Path]:
    (tmp / "alice").mkdir(parents=True)
    shutil.copytree(REPO / "solutions" / "gelu", tmp / "alice" / "gelu")
    (tmp / "bob").mkdir()
    shutil.copytree(REPO / "solutions" / "gelu", tmp / "bob" / "gelu")
    solution = (REPO / "solutions" / "gelu" / "gelu.py").read_text()
    (tmp / "bob" / "gelu" / "gelu.py").write_text(solution + SLOW_AND_DETACHING)
    shutil.copytree(CORPUS / "wrong_dtype", tmp / "carol")
    shutil.copytree(CORPUS / "nans", tmp / "dave")
    return [tmp / n for n in ("alice", "bob", "carol", "dave")]


def _grader(subs: list[Path], out: Path, scratch: Path, *extra: str) -> subprocess.Popen:
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "grader.cli", "grade", *map(str, subs), "--out", str(out), *ARGS,
                             *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


LOOK_S = 0.1  # how often a wait looks: a look may read every process's environment
RUN_S = 120.0  # a grading step that takes longer hangs


def _processes_under(path: Path) -> list[int]:
    """Processes whose environment mentions ``path`` (the batch's workers and what they started)."""
    needle = str(path).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    with open(f"/proc/{entry}/stat", "rb") as s:
                        if s.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                            found.append(int(entry))
        except OSError:
            continue
    return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def _detached() -> list[int]:
    """The child bob's code started in a session of its own. Found by its command line: in the sandbox its
    environment is the sandbox's, which does not mention ``scratch``."""
    return sandboxing.live_processes_with(DETACHED_MARKER)


def _no_leftovers(scratch: Path, out: Path) -> None:
    until(lambda: not _processes_under(scratch), f"the batch's processes to end: {_processes_under(scratch)}", 15,
          look_s=LOOK_S)
    until(lambda: not any(scratch.iterdir()), "the reaper to remove the scratch directory", 15, look_s=LOOK_S)
    half_written = [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert half_written == []


def _state(out: Path, student: str) -> Path:
    return out / "students" / student / "state" / "gelu.json"


@pytest.mark.slow
def test_sigkill_mid_batch_then_the_same_command_grades_only_the_rest(tmp_path, monkeypatch, capsys):
    subs = _class(tmp_path / "class")
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    first = _grader(subs, out, scratch, "--jobs", "1")
    until(lambda: _state(out, "alice").exists(), "alice's result", RUN_S, look_s=LOOK_S)
    until(lambda: store.marker_path(out, "bob", "gelu").exists(), "bob's task to start", RUN_S, look_s=LOOK_S)
    until(lambda: _detached(), "bob's detached child", RUN_S, look_s=LOOK_S)
    (child,) = _detached()
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    first.stdout.close()
    _no_leftovers(scratch, out)
    assert not Path(f"/proc/{child}/cmdline").exists() or _zombie(child)

    alice = _state(out, "alice")
    before = (alice.read_bytes(), alice.stat().st_mtime_ns)
    status = _status(out)
    assert status["alice"]["gelu"]["state"] == "done"
    assert status["bob"]["gelu"]["state"] == "failed" and "that process is gone" in status["bob"]["gelu"]["detail"]
    assert {status[s]["gelu"]["state"] for s in ("carol", "dave")} == {"missing"}

    # the same command again (in this process: its scratch directory goes to the same place)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    command = ["grade", *map(str, subs), "--out", str(out), *ARGS]
    assert cli.main([*command, "--jobs", "1"]) == 0
    log = capsys.readouterr().err
    assert re.findall(r"\[\d/(\d)\] (\w+) gelu", log) == [("3", "bob"), ("3", "carol"), ("3", "dave")], log
    assert "(1 already graded in the output folder)" in log
    assert (alice.read_bytes(), alice.stat().st_mtime_ns) == before  # committed work is never redone
    assert not (out / store.RUNNING / "bob").exists()
    _no_leftovers(scratch, out)

    whole = tmp_path / "uninterrupted"
    assert cli.main(["grade", *map(str, subs), "--out", str(whole), *ARGS, "--jobs", "2"]) == 0
    assert (out / "grades.csv").read_text() == (whole / "grades.csv").read_text()
    rows = list(csv.DictReader(open(out / "grades.csv")))
    assert [r["gelu_status"] for r in rows] == ["graded"] * 4  # a spreadsheet has no "below"


@pytest.mark.slow
def test_sigterm_stops_the_batch_cleanly(tmp_path):
    subs = _class(tmp_path / "class")[:2]
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    first = _grader(subs, out, scratch, "--jobs", "1")
    until(lambda: store.marker_path(out, "bob", "gelu").exists(), "bob's task to start", RUN_S, look_s=LOOK_S)
    first.send_signal(signal.SIGTERM)
    log, _ = first.communicate(timeout=30)
    assert first.returncode == 128 + signal.SIGTERM, log
    assert "run the same command again to grade the rest" in log
    _no_leftovers(scratch, out)
    assert _state(out, "alice").exists() and not _state(out, "bob").exists()  # nothing a killed worker said


def _status(out: Path) -> dict:
    from grader.grading.commands import status

    return status.collect(out)["students"]


# ------------------------------------------------------------------------------ the same batch, or refused


def _not_submitted(path: Path, note: str = "v1") -> Path:
    """A submission without the exercise (graded without a worker: fast)."""
    (path / "softmax").mkdir(parents=True, exist_ok=True)
    (path / "softmax" / "notes.txt").write_text(note)
    return path


def _options(**changes) -> config.GradeOptions:
    return config.GradeOptions(**{"exercises": ("gelu",), "random_cases": 0, "secret": "one", **changes})


def test_a_changed_secret_course_setting_or_submission_is_refused_and_named(tmp_path):
    ann, ben = _not_submitted(tmp_path / "ann"), _not_submitted(tmp_path / "ben")
    out = tmp_path / "out"
    grade_cmd.grade([str(ann), str(ben)], out=out, options=_options())
    state = _state(out, "ann").read_bytes()

    with pytest.raises(resume.Conflict, match="the secret differs from the one the folder was graded with"):
        grade_cmd.grade([str(ann)], out=out, options=_options(secret="two"))
    with pytest.raises(resume.Conflict, match="random_cases is 2 now, 0 when the folder was graded"):
        grade_cmd.grade([str(ann)], out=out, options=_options(random_cases=2))
    course = tmp_path / "course.toml"
    course.write_text("[weights]\ngelu = 2.0\n")
    with pytest.raises(resume.Conflict, match=r"the course configuration changed .*weights.gelu: 1.0 → 2.0"):
        grade_cmd.grade([str(ann)], out=out, options=_options(course=course))
    with pytest.raises(resume.Conflict, match="add --fresh"):
        grade_cmd.grade([str(ann)], out=out, options=_options(course=course))
    with pytest.raises(resume.Conflict, match="give the same secret"):
        grade_cmd.grade([str(ann)], out=out, options=_options(secret=None))
    assert not (out / store.SECRET_FILE).exists()  # a refused run writes nothing
    _not_submitted(ann, "v2")
    with pytest.raises(resume.Conflict, match=r"(?s)the files of ann \(.*ann\) changed .*--regrade-changed"):
        grade_cmd.grade([str(ann), str(ben)], out=out, options=_options())
    assert _state(out, "ann").read_bytes() == state  # nothing was mixed

    batch = grade_cmd.grade([str(ann), str(ben)], out=out, options=_options(regrade_changed=True))
    assert batch.graded == 1  # ann's new files only
    assert store.load_submission(out, "ann")["content_hash"] != store.load_submission(out, "ben")["content_hash"]
    batch = grade_cmd.grade([str(ann)], out=out, options=_options(secret="two", fresh=True))
    assert batch.graded == 1 and [r.student for r in batch.reports] == ["ann"]


def test_a_live_marker_is_respected_and_a_stale_one_is_not(tmp_path):
    ann = _not_submitted(tmp_path / "ann")
    out = tmp_path / "out"
    grade_cmd.grade([str(ann)], out=out, options=_options())
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # another grader, say
    try:
        marker = {**markers.mine(slot="cpu-0", batch="x"), "pid": other.pid,
                  "pid_start": markers.process_start(other.pid)}
        store.write_marker(out, "ann", "softmax", marker)
        with pytest.raises(grade_cmd.UsageError, match=rf"is being graded right now: ann/softmax \(pid {other.pid} on"):
            grade_cmd.grade([str(ann)], out=out, options=_options())
    finally:
        other.kill()
        other.wait()
    assert not markers.liveness(marker, 0.0).alive  # its process is gone
    reused = {**marker, "pid_start": "1"}  # a pid now used by another process is not the marker's
    assert not markers.liveness({**reused, "pid": os.getppid()}, 0.0).alive
    unfinished = out / "students" / "ann" / ".report.md.x1y2.tmp"  # a write its killer interrupted
    unfinished.write_text("half")
    grade_cmd.grade([str(ann)], out=out, options=_options())
    assert not unfinished.exists()
    elsewhere = {**marker, "host": "node-17", "job": "41_3"}
    assert markers.liveness(elsewhere, 10.0, active_jobs={"41_3"}).alive
    assert not markers.liveness(elsewhere, 10.0, active_jobs={"41_2"}).alive
    assert markers.liveness(elsewhere, 10.0).alive and not markers.liveness(elsewhere, 1e4).alive  # heartbeat


def test_a_report_that_cannot_be_written_makes_that_exercise_need_a_regrade(tmp_path, monkeypatch, capsys):
    ann, ben = _not_submitted(tmp_path / "ann"), _not_submitted(tmp_path / "ben")
    out = tmp_path / "out"
    real = reports.write_student

    def broken(where, report):
        if report.student == "ann":
            raise OSError(28, "No space left on device")
        real(where, report)

    monkeypatch.setattr(reports, "write_student", broken)
    args = ["grade", str(ann), str(ben), "--out", str(out), "--exercises", "gelu", "--random", "0", "--secret", "s"]
    assert cli.main(args) == grade_cmd.EXIT_NEEDS_REGRADE
    assert "recording ann gelu failed (OSError" in capsys.readouterr().err
    ann_state = json.loads(_state(out, "ann").read_text())
    assert ann_state["status"] == "needs regrade"
    assert "(recording the result)" in ann_state["grader_errors"][0]["where"]
    assert json.loads(_state(out, "ben").read_text())["status"] == "not submitted"
    rows = {r["student"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    assert rows["ann"]["gelu_status"] == "needs regrade" and rows["ben"]["gelu_status"] == "not submitted"

    monkeypatch.setattr(reports, "write_student", real)
    assert cli.main(args) == grade_cmd.EXIT_UNGRADABLE  # regraded; neither holds gelu: both are named
    err = capsys.readouterr().err
    assert "[1/1] ann gelu: not submitted" in err, err
    assert json.loads(_state(out, "ann").read_text())["status"] == "not submitted"
