"""A local batch split over grader processes (``--processes``; one per GPU with several GPUs): each child grades its
share of the students into the same folder, the secret reaches it on stdin only, the parent writes the gradebook;
students a child left because its GPU failed go to the children that ended well."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from grader import exercises
from grader.grading import config
from grader.grading.batch import exits, gpus, split
from grader.grading.batch.context import UsageError
from grader.grading.batch.scheduler import Task
from grader.grading.commands import grade as grade_cmd
from grader.grading.commands import grade_task
from grader.grading.isolation import threads
from grader.grading.results import store

from .sandboxing import sandbox_options

REPO = Path(__file__).parent.parent
GELU = exercises.get("gelu")
SECRET = "split-secret-0123456789"


def _ctx(device: str, jobs: int = 4):
    course = SimpleNamespace(setting=lambda key, dev: {"jobs": jobs}[key])
    return SimpleNamespace(device=device, course=course, out=Path("/nowhere"))


def _gpus(n: int) -> list[gpus.Gpu]:
    return [gpus.Gpu(i, "H100", f"GPU-{i}", str(i), 80 << 30) for i in range(n)]


def _tasks(estimates: dict[str, float]) -> list[Task]:
    return [Task(s, GELU, SimpleNamespace(student=s), estimate_s=e) for s, e in estimates.items()]


def test_how_many_processes_grade_a_batch():
    four = _gpus(4)
    options = config.GradeOptions(gpus="all")
    assert split.count(_ctx("cuda"), options, available=four, current=0) == 4  # one per GPU
    assert split.count(_ctx("cuda"), options.replace(processes=1), available=four, current=0) == 1
    assert split.count(_ctx("cuda"), config.GradeOptions(), available=four, current=0) == 1  # the current GPU
    with pytest.raises(UsageError, match="one per GPU"):
        split.count(_ctx("cuda"), options.replace(processes=3), available=four, current=0)
    assert split.count(_ctx("cpu"), config.GradeOptions()) == 1
    assert split.count(_ctx("cpu"), config.GradeOptions(processes=3)) == 3


def test_shares_take_whole_students_longest_work_first(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 16)
    tasks = _tasks({"a": 10.0, "b": 9.0, "c": 5.0, "d": 4.0, "e": 1.0}) + _tasks({"c": 6.0})  # c: two exercises
    shares = split.shares(_ctx("cpu", jobs=5), config.GradeOptions(), tasks, 2)
    # c (11 s in all) first, then a, b, d, e: each to the share with the least work so far
    assert [s.students for s in shares] == [["c", "d", "e"], ["a", "b"]]
    assert [s.estimate_s for s in shares] == [16.0, 19.0]
    assert [s.jobs for s in shares] == [2, 2]  # --jobs (here the course's 5) shared, at least one each
    assert all(s.env[threads.CORES_VARIABLE] == "8" for s in shares)
    on_gpus = split.shares(_ctx("cuda"), config.GradeOptions(gpus="all"), tasks, 4, available=_gpus(4), current=0)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in on_gpus] == ["0", "1", "2", "3"]  # each child pinned to its GPU
    assert [s.label for s in on_gpus] == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
    assert all(s.jobs == gpus.auto_jobs(_gpus(1)[0], gpus=4, cores=16) and s.env[threads.CORES_VARIABLE] == "4"
               for s in on_gpus)
    one = split.shares(_ctx("cuda"), config.GradeOptions(gpus="all"), _tasks({"solo": 50.0}), 4, available=_gpus(4),
                       current=0)
    assert len(one) == 1  # a single submission is one share: it stays in the grader's own process


def test_a_share_of_the_cores_is_what_a_child_counts(monkeypatch):
    monkeypatch.setenv(threads.CORES_VARIABLE, "3")
    assert threads.available_cores() == min(3, len(__import__("os").sched_getaffinity(0)))
    monkeypatch.setenv(threads.CORES_VARIABLE, "100000")
    assert threads.available_cores() == len(__import__("os").sched_getaffinity(0))  # never more than it has
    monkeypatch.setenv(threads.CORES_VARIABLE, "")
    assert threads.available_cores() == len(__import__("os").sched_getaffinity(0))


def test_a_split_batch_grades_each_student_once_with_the_secret_on_stdin_only(tmp_path, monkeypatch, capsys):
    for name in ("amy", "bo", "cy"):
        shutil.copytree(REPO / "solutions" / "gelu", tmp_path / "subs" / name / "gelu")
    started = []
    real_popen = subprocess.Popen

    def recording_popen(argv, *args, **kwargs):
        if "grade-task" in list(argv):
            started.append((list(argv), dict(kwargs["env"])))
        return real_popen(argv, *args, **kwargs)

    monkeypatch.setattr(split.subprocess, "Popen", recording_popen)
    monkeypatch.setenv("GRADER_SECRET", SECRET)  # given as the instructor would: never passed on to a child
    options = config.GradeOptions(exercises=("gelu",), jobs=2, processes=2, random_cases=0, timeout_s=120.0,
                                  call_timeout_s=10.0, **sandbox_options())
    out = tmp_path / "out"
    batch = grade_cmd.grade([str(tmp_path / "subs" / n) for n in ("amy", "bo", "cy")], out=out, options=options)
    err = capsys.readouterr().err
    assert batch.graded == 3 and batch.left == 0
    assert len(started) == 2
    for argv, env in started:
        assert argv[3:5] == ["grader.cli", "grade-task"] and "--students" in argv
        assert SECRET not in " ".join(argv) and all(SECRET not in v for v in env.values())
    listed = [json.loads(p.read_text())["students"] for p in sorted((out / "staff" / split.FOLDER).glob("*.json"))]
    names = [s["student"] for share in listed for s in share]
    assert sorted(names) == ["amy", "bo", "cy"]  # every student in exactly one share
    assert "[share 1] " in err and "[share 2] " in err  # the children's lines, under their names
    assert "[3/3] " in err  # the whole batch's progress, from the folder
    assert not re.search(r"\[share \d\] \[\d+/\d+\]", err)  # not each child's own
    with open(out / store.GRADEBOOK, newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["amy", "bo", "cy"]
    assert all(store.load_exercises(out, s)["gelu"].status == "graded" for s in rows)


def test_a_share_refuses_a_wrong_secret(tmp_path, capsys):
    shutil.copytree(REPO / "solutions" / "gelu", tmp_path / "amy" / "gelu")
    options = config.GradeOptions(exercises=("gelu",), jobs=1, random_cases=0, secret=SECRET, **sandbox_options())
    grade_cmd.grade([str(tmp_path / "amy")], out=tmp_path / "out", options=options)
    listed = tmp_path / "share.json"
    listed.write_text(json.dumps({"students": [{"student": "amy"}]}))
    args = SimpleNamespace(out=str(tmp_path / "out"), merge=None, students=str(listed), jobs=1, profile=False,
                           tasks=None, index=None)
    sys_stdin = sys.stdin
    try:
        sys.stdin = __import__("io").StringIO("not-the-secret\n")
        assert grade_task.run(args) == 2
    finally:
        sys.stdin = sys_stdin
    assert "not the secret this run was graded with" in capsys.readouterr().err


def test_students_a_failed_gpu_left_go_to_the_shares_that_ended_well(tmp_path):
    """A first round where GPU 0's child ends with "runs left ungraded" (its GPU failed) and GPU 1's grades its own:
    a second round hands GPU 0's students to GPU 1."""
    ctx = SimpleNamespace(out=tmp_path)
    tasks = _tasks({"a": 3.0, "b": 2.0, "c": 1.0})
    shares = [split.Share("GPU 0", ["a", "c"]), split.Share("GPU 1", ["b"])]
    rounds = []

    def fake_round(ctx, shares_, folder, *, secret, profile, round_, note):
        rounds.append([(s.label, list(s.students)) for s in shares_])
        ended = []
        for share in shares_:
            failed = share.label == "GPU 0"
            if not failed:
                for student in share.students:
                    (tmp_path / "students" / student / "state").mkdir(parents=True, exist_ok=True)
                    (tmp_path / "students" / student / "state" / "gelu.json").write_text("{}")
            ended.append((share, exits.UNFINISHED if failed else 0))
        return ended

    original = split._round
    split._round = fake_round
    try:
        left = split.run(ctx, tasks, shares, secret=SECRET, profile=False)
    finally:
        split._round = original
    assert rounds == [[("GPU 0", ["a", "c"]), ("GPU 1", ["b"])], [("GPU 1", ["a", "c"])]]
    assert left == []


def test_stopping_the_children_kills_one_that_ignores_sigterm(monkeypatch):
    monkeypatch.setattr(split, "STOP_WAIT_S", 0.5)
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE)
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stubborn.stdout.readline().strip() == b"ready"
    began = time.monotonic()
    split._stop([stubborn, polite])
    assert polite.returncode == -15 and stubborn.returncode == -9
    assert time.monotonic() - began < 10


def test_ctrl_c_stops_every_share_and_the_same_command_grades_the_rest(tmp_path):
    """Ctrl-C reaches the parent and its children (one process group): each child stops its workers and says so,
    nothing is left running, and the same command again grades what is left."""
    import os
    import signal

    for name in ("amy", "bo", "cy"):
        shutil.copytree(REPO / "solutions" / "rmsnorm", tmp_path / "subs" / name / "rmsnorm")
    command = [sys.executable, "-m", "grader.cli", "grade", *[str(tmp_path / "subs" / n) for n in ("amy", "bo", "cy")],
               "--exercises", "rmsnorm", "--random", "3", "--processes", "2", "--jobs", "2", "--secret", SECRET,
               "--out", str(tmp_path / "out"), *(["--unsandboxed"] if sandbox_options()["unsandboxed"] else [])]
    graded = subprocess.Popen(command, start_new_session=True, stderr=subprocess.PIPE, text=True)
    assert graded.stderr is not None
    for line in graded.stderr:  # both children have started grading
        if "[share 2] grading" in line or "[share 1] grading" in line:
            break
    time.sleep(1.0)
    os.killpg(graded.pid, signal.SIGINT)
    rest = graded.stderr.read()
    assert graded.wait(timeout=120) == grade_cmd.EXIT_INTERRUPTED, rest
    assert rest.count("grader grade-task: stopped") >= 1 and "grader grade: stopped" in rest, rest
    assert "Traceback" not in rest, rest
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "out")], capture_output=True, text=True).stdout
    assert leftover.strip() == "", leftover
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert all(store.load_exercises(tmp_path / "out", s)["rmsnorm"].status == "graded" for s in ("amy", "bo", "cy"))
