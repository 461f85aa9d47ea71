"""A fault of the grader is never the student's failure: it is recorded with its traceback for staff, the
part it touched "needs regrade" in every report (neither 0 nor passed), ``grader grade`` exits non-zero and
says so, and ``grader grade --regrade-errors OUT`` runs exactly those parts again and scores them."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from grader import cli
from grader.checks import verdicts
from grader.grading.commands import grade as grade_cmd
from grader.grading.exercise_run import runner
from grader.grading.results import store

from ...sandboxing import sandbox_args

pytestmark = pytest.mark.slow  # a few sandboxed workers

REPO = Path(__file__).resolve().parents[3]
ARGS = ["--exercises", "gelu,softmax", "--random", "1", "--secret", "fault-test", "--jobs", "2", *sandbox_args()]


def _csv(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "grades.csv") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def test_a_judge_that_raises_makes_the_part_need_a_regrade_and_the_regrade_scores_it(tmp_path, monkeypatch,
                                                                                    capsys):
    solutions = tmp_path / "alice"
    shutil.copytree(REPO / "solutions", solutions)
    out = tmp_path / "out"
    original = verdicts.correctness

    def faulty(part, case, inputs, ex, device, **kwargs):
        if part.exercise.name == "softmax":
            raise RuntimeError("simulated fault in the grader's judge")
        return original(part, case, inputs, ex, device, **kwargs)

    monkeypatch.setattr(verdicts, "correctness", faulty)
    assert cli.main(["grade", str(solutions), "--out", str(out), *ARGS]) == grade_cmd.EXIT_NEEDS_REGRADE
    err = capsys.readouterr().err
    assert "1 part(s) need a regrade because the grader failed on them" in err
    assert f"grader grade --regrade-errors {out}" in err

    row = _csv(out)["alice"]
    assert row["softmax_status"] == "needs regrade" and row["needs_regrade"] == "softmax/forward"
    assert float(row["pending_regrade"]) > 0 and float(row["softmax"]) == 0
    assert row["gelu_status"] == "graded" and float(row["gelu"]) > 0
    results = json.loads((out / "students" / "alice" / "results.json").read_text())
    pending = [t for t in results["tests"] if t["name"].startswith("softmax") and "needs regrade" in t["name"]]
    assert pending and all("score" not in t and "status" not in t for t in pending)  # neither 0 nor passed
    assert results["output"].startswith("NEEDS REGRADE: softmax/forward")
    html = (out / "students" / "alice" / "report.html").read_text()
    assert 'id="needs-regrade"' in html and "pending a regrade" in html
    assert "needs regrade" in (out / "students" / "alice" / "report.md").read_text()
    log = (out / store.STAFF / "grader-errors.log").read_text()
    assert "simulated fault in the grader's judge" in log and "Traceback" in log
    state = json.loads((out / "students" / "alice" / "state" / "softmax.json").read_text())
    assert state["status"] == "needs regrade"
    gelu_state = (out / "students" / "alice" / "state" / "gelu.json").read_text()

    monkeypatch.setattr(verdicts, "correctness", original)  # the grader is fixed
    calls = []
    real = runner.grade_exercise

    def spy(exercise, root, **kwargs):
        calls.append((exercise.name, kwargs.get("parts")))
        return real(exercise, root, **kwargs)

    monkeypatch.setattr(runner, "grade_exercise", spy)
    assert cli.main(["grade", "--regrade-errors", str(out), "--secret", "fault-test", *sandbox_args()]) == 0
    assert calls == [("softmax", ("forward",))]  # exactly the part that needed it
    row = _csv(out)["alice"]
    assert row["softmax_status"] == "graded" and row["needs_regrade"] == "" and float(row["pending_regrade"]) == 0
    assert float(row["total"]) == pytest.approx(float(row["max_total"]))
    assert (out / "students" / "alice" / "state" / "gelu.json").read_text() == gelu_state


def test_regrade_needs_the_same_secret(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["grade", str(REPO / "solutions"), "--out", str(out), "--exercises", "gelu", "--random", "0",
                     "--secret", "right", *sandbox_args()]) == 0
    assert cli.main(["grade", "--regrade-errors", str(out), "--secret", "wrong", *sandbox_args()]) == 2
    assert "not the secret this run was graded with" in capsys.readouterr().err
    assert cli.main(["grade", "--regrade-errors", str(out), "--secret", "right", *sandbox_args()]) == 0


# The reference GeLU with its right values handed back as every other element of a larger buffer (stride 2,
# also for one element).
STRIDED_GELU = (REPO / "solutions" / "gelu" / "gelu.py").read_text() + '''

_dense_gelu = gelu


def gelu(x):
    y = _dense_gelu(x)
    if x.dim() == 0:
        return y
    out = torch.empty((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype, device=x.device)[..., ::2]
    out.copy_(y)
    return out
'''


def test_outputs_with_stride_two_are_judged_not_crashed_on(tmp_path):
    """A one-element output with stride 2 once made the grader's replay detection raise (a 16-bit or 32-bit
    tensor viewed as bytes needs stride 1), and a right GeLU scored 0."""
    (tmp_path / "bob" / "gelu").mkdir(parents=True)
    (tmp_path / "bob" / "gelu" / "gelu.py").write_text(STRIDED_GELU)
    options = grade_cmd.options_from_args(cli._parser().parse_args(
        ["grade", str(tmp_path / "bob"), "--exercises", "gelu", "--random", "3", "--secret", "s", *sandbox_args()]))
    batch = grade_cmd.grade([str(tmp_path / "bob")], out=tmp_path / "out", options=options)
    ((score, result),) = batch.reports[0].exercises
    assert result.all_grader_errors() == [] and result.status == "graded"
    strided_one = [c for c in result.parts[0].checks if c.case and tuple(c.case["params"]["shape"]) == (1,)]
    assert strided_one and all(c.passed for c in strided_one)
    assert score.score == pytest.approx(score.max_score)
