"""A submission that could not be read is said as such where the instructor looks: the class report and its CSV list
it with the reason (and leave it out of the score statistics, where it would read as an ordinary zero), and
``grader status`` calls every one of its exercises "unreadable", never "done"."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from grader import cli, exercises
from grader.grading import config
from grader.grading.commands import status as status_mod
from grader.grading.results import rebuild, store
from grader.grading.results.results import ERROR, GRADED, PASSED, CheckResult, ExerciseResult, PartResult

ALL = exercises.all_exercises()
NAMES = ["gelu", "softmax"]
WHY = "broken.zip is not a valid zip file"


def _passed(name: str) -> ExerciseResult:
    exercise = exercises.get(name)
    part = PartResult(exercise.parts[0].name, GRADED, checks=[CheckResult("forward.example[0]", "example",
                                                                          "example 0", PASSED, "")])
    return ExerciseResult(name, exercise.title, GRADED, parts=[part])


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    store.write_run(tmp_path, {"exercises": NAMES, "device": "CPU", "secret_salt": "salt",
                               "started": "2026-01-01 10:00:00"})
    store.save_submission(tmp_path, "good", {"source": "/subs/good", "kind": "directory", "problems": []})
    store.save_submission(tmp_path, "broken", {"source": "/subs/broken.zip", "kind": "zip", "problems": [WHY]})
    for name in NAMES:
        store.save_exercise(tmp_path, "good", _passed(name))
        # as the pipeline records an exercise of a submission it could not read
        store.save_exercise(tmp_path, "broken", ExerciseResult(name, exercises.get(name).title, ERROR,
                                                               "the submission could not be read: " + WHY))
    rebuild.rebuild(tmp_path, course=config.load_course(), all_exercises=ALL)
    return tmp_path


def test_the_class_report_lists_an_unreadable_submission_with_its_reason(folder):
    html = (folder / store.CLASS_REPORT_HTML).read_text()
    table = html.split('id="ungradable-table"')[1].split("</table>")[0]
    assert "broken" in table and WHY in table and "good" not in table
    assert "1 could not be graded" in html
    # the statistics count the one student who was graded: no zero, no second student
    assert 'id="stat-total-n">1<' in html and 'id="stat-total-zero">0<' in html
    with open(folder / store.CLASS_REPORT_CSV) as f:
        rows = list(csv.DictReader(f))
    assert [(r["student"], r["detail"]) for r in rows if r["section"] == "ungradable"] == [("broken", WHY)]
    assert next(r for r in rows if r["section"] == "score" and r["exercise"] == "total" and r["item"] == "n")[
        "value"] == "1"


def test_status_says_unreadable_for_every_exercise_of_an_unreadable_submission(folder, capsys):
    found = status_mod.collect(folder)
    assert found["students"]["broken"] == {n: {"state": "unreadable", "detail": WHY} for n in NAMES}
    assert {c["state"] for c in found["students"]["good"].values()} == {"done"}
    assert found["counts"]["unreadable"] == 2 and found["counts"]["done"] == 2
    assert cli.main(["status", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "unreadable" in out and "2 done, 2 unreadable" in out
