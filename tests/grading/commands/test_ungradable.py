"""A submission of which nothing can be graded (an unreadable zip or notebook, a folder with no exercise module)
is named with its one-line reason where the instructor looks — the terminal summary, ``grader status`` — and
``grader grade`` exits with its own status; a submission with only some exercises is graded, not named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from grader import cli
from grader.grading.commands import grade as grade_cmd
from grader.grading.commands import status as status_mod

from ...sandboxing import sandbox_args

REPO = Path(__file__).resolve().parents[3]
CORPUS = REPO / "tests" / "submissions"


def test_what_could_not_be_graded_is_named_and_the_exit_status_says_so(tmp_path, capsys):
    empty = tmp_path / "empty" / "notes"
    empty.mkdir(parents=True)
    (empty / "readme.txt").write_text("my kernels are on my laptop\n")
    partial = tmp_path / "partial"
    shutil.copytree(REPO / "solutions" / "gelu", partial / "gelu")
    subs = [CORPUS / "corrupt_zip.zip", CORPUS / "notebook_not_json.ipynb", tmp_path / "empty", partial]
    out = tmp_path / "out"
    args = ["grade", *map(str, subs), "--out", str(out), "--exercises", "gelu,softmax", "--random", "0",
            "--secret", "s", *sandbox_args()]
    assert cli.main(args) == grade_cmd.EXIT_UNGRADABLE
    err = capsys.readouterr().err
    assert "3 submission(s) had nothing that could be graded" in err
    assert "corrupt_zip: corrupt_zip.zip is not a valid zip file" in err
    assert "notebook_not_json: notebook notebook_not_json.ipynb is not valid: it is not JSON" in err
    assert "empty: empty: no exercise module found (expected files like gelu/gelu.py" in err
    assert "partial:" not in err  # gelu was there: graded, softmax "not submitted"

    found = status_mod.collect(out)
    assert set(found["ungradable"]) == {"corrupt_zip", "notebook_not_json", "empty"}
    assert cli.main(["status", str(out)]) == 0
    assert "corrupt_zip: nothing could be graded: corrupt_zip.zip is not a valid zip file" in capsys.readouterr().out
    assert json.loads((out / "students" / "partial" / "results.json").read_text())["score"] > 0
