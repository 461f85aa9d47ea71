"""``grader grade`` end to end, in ONE batch: the reference solutions, the untouched stubs, a notebook and a
zip made from the solution, and the broken-submission corpus in tests/submissions/. Every student gets
every report, the right score and a message that says what went wrong; nothing is lost."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from grader.grading import config
from grader.grading.commands import grade as grade_cmd
from grader.grading.exercise_run import supervise
from grader.grading.isolation import bwrap

from ...sandboxing import live_processes_with, sandbox_args, sandbox_options, sandboxed

pytestmark = pytest.mark.slow  # one batch of ~20 sandboxed workers: about a minute on 2 cores

TESTS = Path(__file__).parents[2]
REPO = TESTS.parent
CORPUS = TESTS / "submissions"

# student -> (score: "full" | "zero" | "partial", exercise status, regex that the student's report must match)
EXPECTED = {
    "solutions": ("full", "graded", r"correctness \(\d+/\d+ checks\)"),
    "stubs": ("zero", "not implemented", r"gelu is not implemented yet — see assignments/gelu/README.md"),
    "notebook": ("full", "graded", r"correctness"),
    "zip_student": ("full", "graded", r"correctness"),  # the id comes from student.toml inside the zip
    "syntax_error": ("zero", "error", r"gelu.py has a syntax error at line 6"),
    "missing_function": ("zero", "error", r"gelu.py defines no function gelu"),
    "wrong_signature": ("zero", "graded", r"gelu raised TypeError: gelu\(\) missing 1 required positional argument"),
    "infinite_loop": ("zero", "graded",
                      r"took longer than the \d+ s allowed for one call \(stopped\) while running the forward "
                      r"example case.*where it was:\n\s+File \"gelu/gelu.py\", line \d+ in gelu"),
    "os_exit": ("zero", "graded", r"exited early \(exit code 3\) while running the forward example case"),
    "segfault": ("zero", "graded", r"crashed with SIGSEGV while running.*Segmentation fault.*gelu/gelu.py"),
    "huge_output": ("full", "graded", r"correctness"),
    "wrong_shape": ("partial", "graded", r"y: shape \(1,\), expected \(\)"),
    "wrong_dtype": ("partial", "graded", r"y: dtype torch.float32, expected torch.b?float16"),
    "nans": ("zero", "graded", r"NaN where a number was expected"),
    "child_process": ("full", "graded", r"correctness"),
    "forged_result": ("zero", "error", r"the worker sent a malformed result"),
    "replay_cache": ("zero", "graded", r"Integrity flag `fresh-inputs`.*exactly the output of an earlier call"),
    "torch_on_bf16": ("zero", "graded", r"Integrity flag `no-torch-compute`.*aten.gelu.*bfloat16"),
    "memory_hog": ("zero", "graded", r"gelu raised MemoryError"),
    "import_probe": ("full", "graded", r"correctness"),
    "notebook_not_json": ("zero", "error", r"notebook notebook_not_json.ipynb is not valid: .*JSON"),
    "notebook_bad_schema": ("zero", "error",
                            r"notebook notebook_bad_schema.ipynb is not valid: 'execution_count' is a required"),
    "corrupt_zip": ("zero", "error", r"corrupt_zip.zip is not a valid zip file"),
}


def _notebook(path: Path) -> Path:
    source = (REPO / "solutions" / "gelu" / "gelu.py").read_text()
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("My GeLU"),
        nbformat.v4.new_code_cell("%load_ext autoreload\nprint('scratch cell, not graded')"),
        nbformat.v4.new_code_cell("# %% exercise: gelu\n" + source),
    ])
    nbformat.write(nb, str(path))
    return path


def _zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:  # a folder zipped whole, with a manifest naming the student
        zf.writestr("my-work/student.toml", 'student_id = "zip_student"\n')
        zf.write(REPO / "solutions" / "gelu" / "gelu.py", "my-work/gelu/gelu.py")
    return path


def _options(**overrides) -> config.GradeOptions:
    options = {"exercises": ("gelu",), "jobs": 2, "timeout_s": 120.0, "call_timeout_s": 4.0, "random_cases": 0,
               "secret": "test-secret", **sandbox_options()}
    options.update(overrides)
    return config.GradeOptions(**options)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batch")
    shutil.copytree(REPO / "assignments", tmp / "stubs")
    shutil.copytree(REPO / "solutions", tmp / "solutions")
    # the corpus folder is passed as it is: a folder of submissions stands for its entries
    paths = [tmp / "solutions", tmp / "stubs", _notebook(tmp / "notebook.ipynb"), _zip(tmp / "zipped.zip"), CORPUS]
    out = tmp / "out"
    start = time.monotonic()
    result = grade_cmd.grade([str(p) for p in paths], out=out, options=_options())
    return result, out, time.monotonic() - start


def test_corpus_and_expectations_agree():
    names = {p.stem for p in CORPUS.iterdir()}
    assert names == set(EXPECTED) - {"solutions", "stubs", "notebook", "zip_student"}


def test_every_student_gets_every_report(batch):
    result, out, _ = batch
    assert {r.student for r in result.reports} == set(EXPECTED)
    for student in EXPECTED:
        for name in ("results.json", "report.md", "report.html", "details.json", "state/gelu.json"):
            assert (out / "students" / student / name).is_file(), f"{student}: no {name}"
    with open(out / "grades.csv") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert set(rows) == set(EXPECTED)
    assert all(rows[s]["gelu_status"] != "pending" for s in rows)
    assert (out / "run.json").is_file()
    assert not (out / "secret.txt").exists()  # the secret came from the options: nothing to write


@pytest.mark.parametrize("student", sorted(EXPECTED))
def test_score_status_and_message(batch, student):
    result, out, _ = batch
    expected_score, expected_status, pattern = EXPECTED[student]
    report = next(r for r in result.reports if r.student == student)
    (score, _), = report.exercises
    assert score.status == expected_status, f"{student}: {score.status}: {score.message}"
    assert score.max_score > 0
    if expected_score == "full":
        assert score.score == pytest.approx(score.max_score), (out / "students" / student / "report.md").read_text()
    elif expected_score == "zero":
        assert score.score == 0
    else:
        assert 0 < score.score < score.max_score
    text = (out / "students" / student / "report.md").read_text()
    assert re.search(pattern, text, re.DOTALL), f"{student}: no match for {pattern!r} in\n{text}"
    gradescope = json.loads((out / "students" / student / "results.json").read_text())
    assert gradescope["score"] == pytest.approx(score.score, abs=1e-3)
    for test in gradescope["tests"]:
        assert set(test) >= {"name", "score", "max_score", "status", "output", "visibility"}
        assert test["status"] in ("passed", "failed") and test["visibility"] == "visible"
    assert sum(t["score"] for t in gradescope["tests"]) == pytest.approx(gradescope["score"], abs=1e-3)


def test_huge_output_is_capped_in_the_log(batch):
    _, out, _ = batch
    log = (out / "students" / "huge_output" / "logs" / "gelu.log").read_text()
    assert "more bytes of output not kept" in log
    assert len(log) < 200_000


def test_processes_left_running_are_killed(batch):
    _, out, _ = batch
    log = (out / "students" / "child_process" / "logs" / "gelu.log").read_text()
    assert "killed 2 process(es) it left running" in log
    assert re.search(r"child pids: (\d+) (\d+)", log)  # they were started
    assert live_processes_with("child_process-fixture") == []


def test_student_code_cannot_reach_the_solutions_or_the_secret(batch):
    _, out, _ = batch
    log = (out / "students" / "import_probe" / "logs" / "gelu.log").read_text()
    assert "PROBE solutions: not importable" in log
    path = log.split("PROBE sys.path:", 1)[1].splitlines()[0]
    assert str(REPO) + "'" not in path and str(REPO / "solutions") not in path
    cwd = log.split("PROBE cwd:", 1)[1].splitlines()[0].strip()
    assert not cwd.startswith(str(REPO))
    assert cwd == bwrap.SCRATCH if sandboxed() else "/run-" in cwd  # a private scratch folder either way
    env = log.split("PROBE env:", 1)[1].splitlines()[0]
    assert "GRADER_SECRET" not in env and "'HOME'" in env


def test_the_fake_score_printed_by_a_student_is_ignored(batch):
    result, out, _ = batch
    report = next(r for r in result.reports if r.student == "forged_result")
    assert report.score == 0
    assert '{"score": 100.0' in (out / "students" / "forged_result" / "logs" / "gelu.log").read_text()


def test_generated_secret_is_written_for_the_instructor(tmp_path, monkeypatch):
    monkeypatch.delenv("GRADER_SECRET", raising=False)
    grade_cmd.grade([str(CORPUS / "syntax_error")], out=tmp_path, options=_options(secret=None))
    secret = (tmp_path / "secret.txt").read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{32}", secret)
    assert (tmp_path / "secret.txt").stat().st_mode & 0o077 == 0


def test_cases_depend_on_the_secret():
    from grader import exercises
    from grader.grading.exercise_run import item_plan

    exercise = exercises.get("gelu")

    def seeds(secret):
        items = item_plan.plan(exercise, device="cpu", secret=secret, random_cases=3, speed_budget_s=1.0)
        return [(it.id, it.case.seed) for it in items if it.case is not None]

    a, b = seeds("one"), seeds("two")
    assert [i for i, _ in a] == [i for i, _ in b]
    assert all(sa != sb for (_, sa), (_, sb) in zip(a, b)), "a case's values do not depend on the secret"
    assert seeds("one") == a, "the same secret must give the same run"
    assert all(seed != 0 for _, seed in a)


def test_verify_passes_on_the_solutions_and_fails_on_a_broken_tree(tmp_path, capsys):
    from grader import cli

    args = ["--exercises", "gelu", "--random", "0", "--secret", "s", *sandbox_args()]
    assert cli.main(["verify", *args, "--out", str(tmp_path / "ok")]) == 0
    assert "grader verify: OK" in capsys.readouterr().err
    assert (tmp_path / "ok" / "students" / "solutions" / "report.html").is_file()
    assert cli.main(["verify", "--solutions", str(CORPUS / "wrong_dtype"), *args]) == 1
    err = capsys.readouterr().err
    assert "grader verify: FAILED" in err and "gelu / forward: correctness" in err


def test_the_profile_says_where_the_time_and_the_cpu_went(tmp_path, capsys):
    """``--profile``: each exercise's steps (the longest worker group among them) and, for the batch, the wall time
    and the host's CPU time split between the grader's own process and the rest (its workers and timers)."""
    shutil.copytree(REPO / "solutions", tmp_path / "solutions")
    grade_cmd.grade([str(tmp_path / "solutions")], out=tmp_path / "out", options=_options(profile=True))
    err = capsys.readouterr().err
    assert "batch profile: 1 submission(s), 1 exercise run(s)" in err
    line = next(line for line in err.splitlines() if "CPU time" in line)
    found = re.search(r"CPU time (\S+) s on the host.* own process (\S+) s .* the rest (\S+) s", line)
    host, own, rest = (float(x) for x in found.groups())
    assert rest > 1.0  # the worker imports torch and triton: well over a second of CPU
    assert own >= 0 and own + rest == pytest.approx(host, abs=0.15)
    # the workers' own figure, read per process tree: part of the rest, and most of it
    workers = float(re.search(r"the workers' and trusted timers' CPU ([0-9.]+) s", err).group(1))
    assert 1.0 < workers <= rest + 0.3, (workers, rest)
    assert re.search(r"profile solutions gelu: .*longest worker group [0-9.]+ s", err)
    # the grader's own process: its CPU by kind of thread, and how long its threads queue for its interpreter
    assert "the grader's own CPU by thread: " in err
    assert re.search(r"ran Python again [0-9.]+ ms late \(median\)", err)
    # the batch window by window: the one run in flight from the start, and the host's CPU
    assert "the batch every 10 s: exercise runs in flight, the host's CPU busy" in err
    assert re.search(r"^ +0–\d+ s: 1 run\(s\) \(gelu 1\), CPU \d+ %", err, re.MULTILINE)
    state = json.loads((tmp_path / "out" / "students" / "solutions" / "state" / "gelu.json").read_text())
    assert state["profile"]["longest worker group"] > 0 and state["counts"]["worker groups"] == 1
    # the worker's wait for the grader between its reply and the next request: some, and part of the group's time
    assert 0 < state["profile"][supervise.IDLE] < state["profile"]["longest worker group"]


def test_the_profile_names_each_worker_group_by_its_parts():
    """Where an exercise's parts run in worker groups side by side, ``--profile`` gives each group's wall time under
    the group's name: its parts, and "speed" for a part's speed measurement in a worker of its own."""
    from types import SimpleNamespace

    from grader.grading.exercise_run import runner

    def item(part: str, role: str):
        return SimpleNamespace(part=SimpleNamespace(name=part), role=role)

    assert runner._group_name([item("forward", "example"), item("forward", "random"), item("forward", "speed")]) \
        == "forward"
    assert runner._group_name([item("autograd", "speed")]) == "autograd speed"
    assert runner._group_name([item("forward", "example"), item("backward", "example")]) == "forward + backward"


def test_the_profile_splits_the_hosts_cpu_time_between_the_grader_and_the_rest(monkeypatch):
    """The host's busy time over the batch, the grader's own CPU time out of it, and the rest (its workers and timers,
    whose CPU the kernel does not count among the grader's children when they run in a sandbox)."""
    from types import SimpleNamespace

    from grader.grading.batch import profiling

    ticks = os.sysconf("SC_CLK_TCK")
    monkeypatch.setattr(profiling, "host_cpu", lambda: (12.0 * ticks, 40.0 * ticks))  # 10 s busy of 32 since before
    monkeypatch.setattr(profiling, "own_cpu", lambda: 5.0)  # 3 s of it the grader's own
    notes = []
    progress = SimpleNamespace(started=time.monotonic() - 20.0, done=4, note=notes.append)
    profiling.report(progress, [], submissions=2, cpu_before=(2.0 * ticks, 8.0 * ticks), own_before=2.0)
    assert "host CPU busy 31% of" in notes[0]
    assert ("CPU time 10.0 s on the host (5 s per submission): the grader's own process 3.0 s" in notes[0]
            and "the rest 7.0 s (its workers and trusted timers" in notes[0]), notes[0]
