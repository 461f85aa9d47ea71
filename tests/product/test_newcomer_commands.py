"""What a newcomer meets first at the command line: a usage error leaves no empty output folder behind, ``grader
verify`` names a class report that still exists when it returns, and ``grader grade``'s summary table goes to
stdout while progress and diagnostics go to stderr. None of these grade anything."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

from grader import cli, exercises
from grader.grading import config
from grader.grading.batch import pipeline, summary
from grader.grading.batch.context import UsageError
from grader.grading.commands import verify
from grader.grading.results import rebuild, store
from grader.grading.results.results import ERROR, GRADED, UNREADABLE, ExerciseResult

from ..sandboxing import sandbox_args

REPO = Path(__file__).resolve().parents[2]
WHY = "broken.zip is not a valid zip file"


def test_an_unknown_exercise_is_refused_before_the_output_folder_is_made(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["grade", str(REPO / "solutions"), "--out", str(out), "--exercises", "gelu,nope", "--secret", "s"]
    assert cli.main([*args, *sandbox_args()]) == 2
    assert "unknown exercise(s) nope (known: gelu" in capsys.readouterr().err
    assert not out.exists()


def test_a_usage_error_found_later_removes_the_empty_folder_it_made(tmp_path, capsys):
    """Not a submission at all (refused while the submissions are prepared, after the folder was made)."""
    text = tmp_path / "kernels.txt"
    text.write_text("my kernels\n")
    out = tmp_path / "out"
    assert cli.main(["grade", str(text), "--out", str(out), "--secret", "s", *sandbox_args()]) == 2
    assert "kernels.txt" in capsys.readouterr().err
    assert not out.exists()
    kept = tmp_path / "kept"
    kept.mkdir()  # a folder that was there before stays
    assert cli.main(["grade", str(text), "--out", str(kept), "--secret", "s", *sandbox_args()]) == 2
    assert kept.is_dir()


def _fake_grade(paths: list[str], *, out: Path, **_) -> pipeline.Batch:
    """What grade() leaves for verify: a class report in ``out`` and a batch with nothing short of full marks."""
    (out / store.CLASS_REPORT_HTML).write_text("<html></html>")
    print(f"class report: {out / store.CLASS_REPORT_HTML}")
    return pipeline.Batch(out, [], (), 1.0, "CPU")


def test_verify_without_out_keeps_the_class_report_it_names(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(verify, "grade", _fake_grade)
    assert cli.main(["verify", "--exercises", "gelu"]) == 0
    captured = capsys.readouterr()
    named = Path(captured.out.split("class report: ")[1].split()[0])
    assert named.is_file() and named.parent.parent == tmp_path and named.parent.name.startswith("grader-verify-")
    assert f"grader verify: reports kept in {named.parent}" in captured.err


def test_verify_refused_leaves_no_empty_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def refuse(*_, **__):
        raise UsageError("unknown exercise(s) nope")

    monkeypatch.setattr(verify, "grade", refuse)
    assert cli.main(["verify", "--exercises", "nope"]) == 2
    assert "grader verify: unknown exercise(s) nope" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_summary_table_goes_to_stdout_and_diagnostics_to_stderr(tmp_path, capsys):
    gelu = exercises.get("gelu")
    store.write_run(tmp_path, {"exercises": ["gelu"], "device": "CPU", "secret_salt": "salt"})
    store.save_submission(tmp_path, "fine", {"source": "/subs/fine", "kind": "directory", "problems": []})
    store.save_submission(tmp_path, "broken", {"source": "/subs/broken.zip", "kind": "zip", "problems": [WHY]})
    store.save_exercise(tmp_path, "fine", ExerciseResult("gelu", gelu.title, GRADED))
    store.save_exercise(tmp_path, "broken", ExerciseResult("gelu", gelu.title, ERROR, UNREADABLE + WHY))
    students = rebuild.all_reports(tmp_path, course=config.load_course(), all_exercises=exercises.all_exercises())
    ctx = SimpleNamespace(out=tmp_path, settings=SimpleNamespace(random_cases=0))
    summary.summary(ctx, pipeline.Batch(tmp_path, students, (gelu,), 2.0, "CPU", graded=2), "Grades")
    captured = capsys.readouterr()
    assert "Grades (CPU)" in captured.out and "fine" in captured.out and "student" in captured.out
    assert f"class report: {tmp_path / store.CLASS_REPORT_HTML}" in captured.out
    assert "Grades" not in captured.err and "class report" not in captured.err
    assert f"1 submission(s) had nothing that could be graded:\n  broken: {WHY}" in captured.err
