"""A notebook is read in a child process within a memory bound (grader/grading/batch/notebook_reader.py): its cells'
outputs are dropped before anything else is built from them, and a notebook whose code needs more than the bound is
that submission's problem, said as such, never the grader's memory."""

import json

import pytest

from grader import exercises
from grader.grading.batch import notebook_reader, submission

ALL = exercises.all_exercises()


def _notebook(path, *, source: str, output: str = "") -> None:
    outputs = [{"output_type": "stream", "name": "stdout", "text": output}] if output else []
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": 1, "id": "c1", "metadata": {}, "outputs": outputs,
                   "source": source}],
        "metadata": {"grader": {"student_id": "bob"}}, "nbformat": 4, "nbformat_minor": 5}))


@pytest.fixture
def small_bound(monkeypatch):
    monkeypatch.setattr(notebook_reader, "MEMORY_BYTES", 200 << 20)


def test_outputs_do_not_count_against_the_bound(tmp_path, small_bound):
    path = tmp_path / "plots.ipynb"
    _notebook(path, source="# %% exercise: gelu\ndef gelu(x):\n    return x\n", output="x" * 40_000_000)
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert sub.usable and sub.student == "bob", sub.problems
    assert "def gelu(x)" in (sub.root / "gelu" / "gelu.py").read_text()


def test_code_beyond_the_bound_is_the_submissions_problem_said_as_such(tmp_path, small_bound):
    path = tmp_path / "huge.ipynb"
    _notebook(path, source="# %% exercise: gelu\n" + "# padding\n" * 8_000_000)
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert not sub.usable
    assert any(p.startswith("notebook huge.ipynb needs more than 200 MiB of memory to read") for p in
               sub.problems), sub.problems


def test_within_the_default_bound_the_same_code_is_read(tmp_path):
    path = tmp_path / "huge.ipynb"
    _notebook(path, source="# %% exercise: gelu\n" + "# padding\n" * 8_000_000)
    assert len(notebook_reader.read(path)["cells"][0]["source"]) > 80_000_000
