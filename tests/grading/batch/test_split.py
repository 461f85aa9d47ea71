"""A local batch split over grader processes (``--processes``; one per GPU with several GPUs): each child grades its
share of the students into the same folder, the secret reaches it on stdin only, the parent writes the gradebook;
students a child left because its GPU failed go to the children that ended well."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
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
from tests.gates import until

from ...sandboxing import sandbox_options

REPO = Path(__file__).parents[3]
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
    with pytest.raises(UsageError, match="1 or more"):
        split.count(_ctx("cpu"), config.GradeOptions(processes=0))


def test_processes_is_refused_with_slurm_and_before_anything_is_recorded(tmp_path, capsys):
    from grader import cli

    shutil.copytree(REPO / "solutions" / "gelu", tmp_path / "amy" / "gelu")
    args = ["grade", str(tmp_path / "amy"), "--exercises", "gelu", "--out", str(tmp_path / "out")]
    assert cli.main([*args, "--processes", "2", "--slurm"]) == 2
    assert "--processes splits a batch graded here" in capsys.readouterr().err
    assert cli.main([*args, "--processes", "0", "--secret", SECRET, "--random", "0",
                     *(["--unsandboxed"] if sandbox_options()["unsandboxed"] else [])]) == 2
    assert "--processes 0: give 1 or more" in capsys.readouterr().err
    assert not (tmp_path / "out" / store.RUN_FILE).exists()  # refused before the batch was recorded


def test_shares_take_whole_students_longest_work_first(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 16)
    tasks = _tasks({"a": 10.0, "b": 9.0, "c": 5.0, "d": 4.0, "e": 1.0}) + _tasks({"c": 6.0})  # c: two exercises
    shares = split.shares(_ctx("cpu", jobs=5), config.GradeOptions(), tasks, 2)
    # c (11 s in all) first, then a, b, d, e: each to the share with the least work so far
    assert [s.students for s in shares] == [["c", "d", "e"], ["a", "b"]]
    assert [s.estimate_s for s in shares] == [16.0, 19.0]
    assert [s.jobs for s in shares] == [3, 2]  # the course's 5 runs at once, shared
    assert all(s.env[threads.CORES_VARIABLE] == "8" for s in shares)
    on_gpus = split.shares(_ctx("cuda", jobs=0), config.GradeOptions(gpus="all"), tasks, 4, available=_gpus(4),
                           current=0)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in on_gpus] == ["0", "1", "2", "3"]  # each child pinned to its GPU
    assert [s.label for s in on_gpus] == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
    assert all(s.jobs == gpus.auto_jobs(_gpus(1)[0], gpus=4, cores=16) and s.env[threads.CORES_VARIABLE] == "4"
               for s in on_gpus)
    course_jobs = split.shares(_ctx("cuda", jobs=3), config.GradeOptions(gpus="all"), tasks, 4, available=_gpus(4),
                               current=0)
    assert [s.jobs for s in course_jobs] == [3, 3, 3, 3]  # course.toml's jobs_cuda, per GPU
    two = split.shares(_ctx("cuda", jobs=0), config.GradeOptions(gpus="all"), _tasks({"x": 5.0, "y": 4.0}), 4,
                       available=_gpus(4), current=0)
    assert [s.label for s in two] == ["GPU 0", "GPU 1"]  # two students: two children, with half the cores each
    assert all(s.env[threads.CORES_VARIABLE] == "8" for s in two)
    one = split.shares(_ctx("cuda", jobs=0), config.GradeOptions(gpus="all"), _tasks({"solo": 50.0}), 4,
                       available=_gpus(4), current=0)
    assert len(one) == 1  # a single submission is one share: it stays in the grader's own process


def test_a_share_of_the_cores_is_what_a_child_counts(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv(threads.CORES_VARIABLE, "3")
    assert threads.available_cores() == min(3, cores)
    monkeypatch.setenv(threads.CORES_VARIABLE, "100000")
    assert threads.available_cores() == cores  # never more than it has
    monkeypatch.setenv(threads.CORES_VARIABLE, "")
    assert threads.available_cores() == cores


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
                                  call_timeout_s=10.0, profile=True, **sandbox_options())
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
    # --profile: each child's own profile under its name, and the batch's, with every run's workers' CPU added up
    assert "[share 1] batch profile: " in err and "[share 2] batch profile: " in err
    assert "batch profile: 3 submission(s), 3 exercise run(s) in " in err and "over 2 grader processes" in err
    summed = sum(sum(store.load_exercises(out, s)["gelu"].cpu.values()) for s in ("amy", "bo", "cy"))
    line = re.search(r"^  the workers' and trusted timers' CPU ([0-9.]+) s \(", err, re.M)
    assert line and summed > 1.0 and float(line.group(1)) == pytest.approx(summed, abs=0.06), err
    with open(out / store.GRADEBOOK, newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["amy", "bo", "cy"]
    assert all(store.load_exercises(out, s)["gelu"].status == "graded" for s in rows)


def test_a_share_refuses_a_wrong_secret(tmp_path, capsys, monkeypatch):
    shutil.copytree(REPO / "solutions" / "gelu", tmp_path / "amy" / "gelu")
    options = config.GradeOptions(exercises=("gelu",), jobs=1, random_cases=0, secret=SECRET, **sandbox_options())
    grade_cmd.grade([str(tmp_path / "amy")], out=tmp_path / "out", options=options)
    listed = tmp_path / "share.json"
    listed.write_text(json.dumps({"students": [{"student": "amy", "exercises": ["gelu"]}]}))
    args = SimpleNamespace(out=str(tmp_path / "out"), merge=None, students=str(listed), jobs=1, profile=False,
                           keep_work=False, tasks=None, index=None)
    monkeypatch.setattr(sys, "stdin", io.StringIO("not-the-secret\n"))
    assert grade_task.run(args) == 2
    assert "not the secret this run was graded with" in capsys.readouterr().err


def _write_result(out: Path, student: str, exercise: str = "gelu") -> None:
    folder = out / "students" / student / "state"
    folder.mkdir(parents=True, exist_ok=True)
    store.write_atomic(folder / f"{exercise}.json", "{}")  # replaced whole, as a committed result is


def test_students_a_failed_gpu_left_go_to_the_shares_that_ended_well(tmp_path, monkeypatch):
    """A first round where GPU 0's child ends with "runs left ungraded" (its GPU failed) and GPU 1's grades its own:
    a second round hands GPU 0's students to GPU 1. A child that ended otherwise (a usage error) is not retried."""
    ctx = SimpleNamespace(out=tmp_path)
    softmax = exercises.get("softmax")
    tasks = [*_tasks({"a": 3.0, "b": 2.0, "c": 1.0, "d": 1.0}), Task("a", softmax, SimpleNamespace(student="a"))]
    shares = [split.Share("GPU 0", students=["a", "c"]), split.Share("GPU 1", students=["b"]),
              split.Share("GPU 2", students=["d"])]
    rounds, runs = [], []
    _write_result(tmp_path, "a", "softmax")  # written before the split began: graded again only if given again

    def fake_round(self, shares_, number):
        rounds.append([(s.label, list(s.students)) for s in shares_])
        runs.append({s: list(self.runs[s]) for share in shares_ for s in share.students})
        ended = []
        for share in shares_:
            code = {"GPU 0": exits.UNFINISHED, "GPU 2": 2}.get(share.label, 0)
            if code == 0:
                for student in share.students:
                    for exercise in self.runs[student]:
                        _write_result(tmp_path, student, exercise)
            elif code == exits.UNFINISHED:
                _write_result(tmp_path, "a", "softmax")  # a's softmax graded before the GPU failed
            ended.append((share, code))
        return ended

    monkeypatch.setattr(split._Child, "round", fake_round)
    left = split.run(ctx, tasks, shares, secret=SECRET, profile=False)
    assert rounds == [[("GPU 0", ["a", "c"]), ("GPU 1", ["b"]), ("GPU 2", ["d"])], [("GPU 1", ["a", "c"])]]
    assert runs[1] == {"a": ["gelu"], "c": ["gelu"]}  # the second round: only the runs still without a result
    assert [t.student for t in left] == ["d"]


def test_a_run_with_a_result_already_counts_once_its_result_is_replaced(tmp_path):
    """A run that needs a regrade has a result file before the split begins: it is done only once a child has
    written a new one."""
    _write_result(tmp_path, "amy")
    results = split._Results(tmp_path, _tasks({"amy": 1.0, "bo": 1.0}))
    assert [t.student for t in results.left()] == ["amy", "bo"]
    _write_result(tmp_path, "amy")  # a new file (another inode), however soon: no wait for the clock to move
    assert [t.student for t in results.left()] == ["bo"]


def test_a_share_grades_only_the_runs_it_was_given(tmp_path, monkeypatch):
    shutil.copytree(REPO / "solutions" / "gelu", tmp_path / "amy" / "gelu")
    shutil.copytree(REPO / "solutions" / "softmax", tmp_path / "amy" / "softmax")
    out = tmp_path / "out"
    options = config.GradeOptions(exercises=("gelu", "softmax"), jobs=1, random_cases=0, secret=SECRET,
                                  **sandbox_options())
    grade_cmd.grade([str(tmp_path / "amy")], out=out, options=options)
    state = out / "students" / "amy" / "state"
    for name in ("gelu", "softmax"):
        (state / f"{name}.json").unlink()  # both left to grade
    listed = tmp_path / "share.json"
    listed.write_text(json.dumps({"students": [{"student": "amy", "exercises": ["gelu"]}]}))
    assert grade_task.run_share(out, listed, secret=SECRET, jobs=1, profile=False) == 0
    assert sorted(p.stem for p in state.glob("*.json")) == ["gelu"]  # softmax was not this share's


@pytest.mark.realtime
def test_stopping_the_children_kills_one_that_ignores_sigterm(monkeypatch):
    """SIGTERM (the parent's own) goes to each child at once; one still running after the wait is killed. After
    Ctrl-C, which reached the children with the process group, they get the wait first."""
    monkeypatch.setattr(split, "STOP_WAIT_S", 0.5)

    def start(ignoring: bool):
        code = ("import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignoring else "")
                + "print('ready', flush=True)\ntime.sleep(60)")
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert child.stdout.readline().strip() == b"ready"
        return child

    stubborn, polite = start(True), start(False)
    began = time.monotonic()
    split._stop([stubborn, polite], signalled=False)
    assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL
    assert time.monotonic() - began < 10
    waited = start(False)
    began = time.monotonic()
    split._stop([waited], signalled=True)  # its Ctrl-C "never came": after the wait, SIGTERM
    assert waited.returncode == -signal.SIGTERM and time.monotonic() - began >= 0.5


def test_ctrl_c_stops_every_share_and_the_same_command_grades_the_rest(tmp_path):
    """Ctrl-C reaches the parent and its children (one process group): each child stops its workers and says so,
    nothing is left running, and the same command again grades what is left."""
    for name in ("amy", "bo", "cy"):
        shutil.copytree(REPO / "solutions" / "gelu", tmp_path / "subs" / name / "gelu")
    command = [sys.executable, "-m", "grader.cli", "grade", *[str(tmp_path / "subs" / n) for n in ("amy", "bo", "cy")],
               "--exercises", "gelu", "--random", "1", "--processes", "2", "--jobs", "2", "--secret", SECRET,
               "--out", str(tmp_path / "out"), *(["--unsandboxed"] if sandbox_options()["unsandboxed"] else [])]
    # Ctrl-C as at a terminal, however pytest was started (a shell's background job ignores SIGINT, and its
    # children inherit that)
    graded = subprocess.Popen(command, start_new_session=True, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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
    assert all(store.load_exercises(tmp_path / "out", s)["gelu"].status == "graded" for s in ("amy", "bo", "cy"))


def test_the_children_die_with_their_parent(tmp_path):
    """A parent killed outright (SIGKILL: nothing of it runs) takes its children with it: each gets SIGTERM and
    stops its workers; the same command again grades what is left."""
    for name in ("amy", "bo", "cy"):
        shutil.copytree(REPO / "solutions" / "gelu", tmp_path / "subs" / name / "gelu")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "grader.cli", "grade", *[str(tmp_path / "subs" / n) for n in ("amy", "bo", "cy")],
               "--exercises", "gelu", "--random", "1", "--processes", "2", "--jobs", "2", "--secret", SECRET,
               "--out", str(out), *(["--unsandboxed"] if sandbox_options()["unsandboxed"] else [])]
    graded = subprocess.Popen(command, start_new_session=True, stderr=subprocess.PIPE, text=True)
    assert graded.stderr is not None
    for line in graded.stderr:
        if "[share 2] grading" in line or "[share 1] grading" in line:
            break
    graded.kill()
    graded.wait()
    until(lambda: subprocess.run(["pgrep", "-f", f"grade-task {out}"], capture_output=True).returncode != 0,
          "the children died with their parent", 60, look_s=0.2)
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert all(store.load_exercises(out, s)["gelu"].status == "graded" for s in ("amy", "bo", "cy"))
