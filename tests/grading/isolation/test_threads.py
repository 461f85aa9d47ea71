"""CPU threads of a batch's processes: a worker or trusted timer runs torch on one thread, and the grader's judging
threads share the host's cores between the exercise runs at once."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from grader.grading import config
from grader.grading.batch import pipeline
from grader.grading.commands import grade as grade_cmd
from grader.grading.isolation import processes, threads
from grader.grading.results.results import GRADED, ExerciseResult

from ...sandboxing import sandbox_options


def test_a_child_started_with_the_minimal_environment_runs_torch_on_one_thread(tmp_path):
    if threads.available_cores() < 2:
        pytest.skip("one core here: one thread is also torch's default, so the cap cannot be told apart")
    env = processes.minimal_env({}, home=str(tmp_path))
    code = "import torch; print(torch.get_num_threads())"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == str(threads.CHILD_THREADS)


def test_the_grader_judges_with_the_cores_shared_between_the_runs_at_once(tmp_path, monkeypatch):
    """Two exercise runs at once on a host of 8 cores: each judging thread gets 4, and the grader's own setting is
    back afterwards."""
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    seen = []

    def fake_grade(exercise, root, **_):
        seen.append(torch.get_num_threads())
        return ExerciseResult(exercise.name, exercise.title, GRADED)

    monkeypatch.setattr(pipeline.runner, "grade_exercise", fake_grade)
    before = torch.get_num_threads()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    options = config.GradeOptions(exercises=("gelu", "softmax"), jobs=2, secret="s", **sandbox_options())
    grade_cmd.grade([str(tmp_path / "a"), str(tmp_path / "b")], out=tmp_path / "out", options=options)
    assert seen == [4, 4, 4, 4]
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(("runs", "cores", "expected"), [(8, 16, 2), (32, 64, 2), (5, 16, 3), (8, 4, 1), (0, 4, 4)])
def test_grader_threads(runs, cores, expected):
    assert threads.grader_threads(runs, cores) == expected


def test_batches_side_by_side_set_the_threads_back_once_the_last_ends(monkeypatch):
    """``grader serve`` runs batches in threads of one process: one ending first leaves the others' setting."""
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    before = torch.get_num_threads()
    first = threads.judging(2)
    assert first.__enter__() == 4
    with threads.judging(4) as count:
        assert count == 2 and torch.get_num_threads() == 2
    assert torch.get_num_threads() == 2  # the first batch still runs: a batch's setting, not the one before them
    first.__exit__(None, None, None)
    assert torch.get_num_threads() == before
