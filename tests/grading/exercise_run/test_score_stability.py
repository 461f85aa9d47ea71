"""Scores depend on the code, not on the draw: every batch of a course puts the same random cases (shapes, dtypes,
layouts, value kinds: from the course's ``cases_seed``) to every student, with values from the batch's secret, so
a wrong kernel gets the same correctness score under any secret (a late submission, a regrade in a new folder,
another section) and the references full marks."""

from __future__ import annotations

import csv
import shutil

import pytest

from grader import exercises
from grader.grading import config
from grader.grading.commands import grade as grade_cmd
from grader.grading.exercise_run import item_plan

from ... import known_wrong
from ...sandboxing import sandbox_options

SECRETS = ("alpha", "bravo")  # two batches that draw every value differently
GRADED = ("gelu", "softmax")  # every known-wrong fixture of these, graded under each secret (CPU-cheap exercises)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("exercise", [e.name for e in exercises.all_exercises()])
def test_every_batch_of_a_course_puts_the_same_cases(exercise, device):
    def cases(secret, cases_seed):
        items = item_plan.plan(exercises.get(exercise), device=device, secret=secret, random_cases=5,
                          speed_budget_s=1.0, cases_seed=cases_seed)
        return [(it.id, it.case) for it in items if it.case is not None]

    first = cases(SECRETS[0], "course")
    assert any(i.split(".")[1].startswith("random") for i, _ in first), "no random case planned"
    for secret in SECRETS[1:]:
        assert cases(secret, "course") == first, secret
    assert cases(SECRETS[0], "another course") != first  # the course's seed draws them
    per_batch = [cases(secret, "") for secret in SECRETS[:2]]  # no course seed: each batch's secret draws them
    assert [c.seed for _, c in per_batch[0]] != [c.seed for _, c in per_batch[1]]


def test_the_course_file_sets_a_cases_seed_and_grader_grade_warns_while_it_is_the_default(tmp_path, capsys):
    from grader import cli

    assert config.load_course().cases_seed == config.DEFAULT_CASES_SEED
    missing = str(tmp_path / "no-such-submission")
    assert cli.main(["grade", missing, "--out", str(tmp_path / "out")]) == 2  # refused: the path does not exist
    assert "cases_seed is the public default" in capsys.readouterr().err
    private = tmp_path / "course.toml"
    private.write_text('[grading]\ncases_seed = "only the staff know"\n')
    assert cli.main(["grade", missing, "--out", str(tmp_path / "out"), "--course", str(private)]) == 2
    assert "cases_seed" not in capsys.readouterr().err


def test_a_wrong_kernel_gets_the_same_score_under_any_secret(tmp_path):
    fixtures = [f for f in known_wrong.discover() if f.exercise in GRADED]
    folders = []
    for fixture in fixtures:
        folder = tmp_path / "subs" / f"{fixture.exercise}-{fixture.name}"
        shutil.copytree(known_wrong.tree_or_fail(fixture), folder)
        folders.append(str(folder))
    shutil.copytree(known_wrong.SOLUTIONS, tmp_path / "subs" / "reference")
    folders.append(str(tmp_path / "subs" / "reference"))
    scores: dict[str, list[str]] = {}
    for secret in SECRETS:
        out = tmp_path / secret
        options = config.GradeOptions(exercises=GRADED, secret=secret, jobs=2, **sandbox_options())
        grade_cmd.grade(folders, out=out, options=options)
        with open(out / "grades.csv") as f:
            for row in csv.DictReader(f):
                scores.setdefault(row["student"], []).append(row["total"])
    differ = {student: got for student, got in scores.items() if len(set(got)) > 1}
    assert not differ, f"scores that changed with the secret ({', '.join(SECRETS)}): {differ}"
    assert len(scores) == len(fixtures) + 1
    with open(tmp_path / SECRETS[0] / "grades.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["student"] == "reference")
    assert float(row["total"]) == pytest.approx(float(row["max_total"]))
