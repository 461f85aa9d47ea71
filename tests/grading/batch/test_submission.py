"""What a hand-in becomes (grader.grading.batch.submission): a directory, a zip or a notebook copied into the
batch's work folder as a tree of exercise modules, under a student id that is a plain folder name; what cannot be
graded (links, paths out of an archive, unmarked or malformed notebooks) is left out and named, and what is no
submission at all is a usage error."""

from __future__ import annotations

import zipfile
from pathlib import Path

import nbformat
import pytest

from grader import exercises
from grader.grading.batch import submission

ALL = exercises.all_exercises()


def _tree(root: Path, body: str = "def gelu(x):\n    return x\n") -> Path:
    (root / "gelu").mkdir(parents=True)
    (root / "gelu" / "gelu.py").write_text(body)
    return root


def test_directory_submission_is_copied_and_its_id_is_the_folder_name(tmp_path):
    src = _tree(tmp_path / "alice smith")
    (src / "gelu" / "__pycache__").mkdir()
    (src / "gelu" / "__pycache__" / "junk.pyc").write_bytes(b"x")
    (src / "link.py").symlink_to("/etc/passwd")
    sub = submission.prepare(src, tmp_path / "work", ALL)
    assert sub.student == "alice_smith" and sub.kind == "directory"
    assert sub.root is not None and (sub.root / "gelu" / "gelu.py").read_text().startswith("def gelu")
    assert not sub.root.is_relative_to(src)
    assert not (sub.root / "gelu" / "__pycache__").exists() and not (sub.root / "link.py").exists()
    assert any("symbolic links are not graded" in p for p in sub.problems)


def test_nested_assignments_folder_and_manifest(tmp_path):
    src = tmp_path / "upload"
    _tree(src / "assignments")
    (src / "assignments" / "student.toml").write_text('student_id = "bob@example.com"\n')
    sub = submission.prepare(src, tmp_path / "work", ALL)
    assert sub.root == tmp_path / "work" / "files" / "assignments"
    assert sub.student == "bob_example.com"


def test_zip_slip_and_links_are_skipped(tmp_path):
    path = tmp_path / "carol.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("carol/gelu/gelu.py", "def gelu(x):\n    return x\n")
        zf.writestr("../../evil.py", "print('escaped')")
        info = zipfile.ZipInfo("carol/link")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert sub.student == "carol" and sub.root is not None and (sub.root / "gelu" / "gelu.py").is_file()
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "work" / "evil.py").exists()
    assert any("outside the archive" in p for p in sub.problems)
    assert any("symbolic links" in p for p in sub.problems)


def test_folder_without_exercises_reports_what_it_expected(tmp_path):
    (tmp_path / "dave" / "a").mkdir(parents=True)
    (tmp_path / "dave" / "b").mkdir()
    sub = submission.prepare(tmp_path / "dave", tmp_path / "work", ALL)
    assert sub.usable
    assert any("no exercise module found (expected files like gelu/gelu.py" in p for p in sub.problems)


def test_notebook_cells_become_modules(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import this_is_not_graded"),
        nbformat.v4.new_code_cell("# %% exercise: gelu\nimport torch\n%matplotlib inline\n"
                                  "def gelu(x):\n    return x"),
        nbformat.v4.new_markdown_cell("# %% exercise: softmax\n(markdown: ignored)"),
        nbformat.v4.new_code_cell("\n# %% exercise: gelu\nHELPER = 1"),
        nbformat.v4.new_code_cell("# %% exercise: nonsense\npass"),
    ], metadata={"grader": {"student_id": "erin"}})
    path = tmp_path / "whatever.ipynb"
    nbformat.write(nb, str(path))
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert sub.student == "erin" and sub.kind == "notebook"
    module = (sub.root / "gelu" / "gelu.py").read_text()
    assert "def gelu(x)" in module and "HELPER = 1" in module and "this_is_not_graded" not in module
    assert "# [ipython magic, not graded] %matplotlib inline" in module
    compile(module, "gelu.py", "exec")
    assert not (sub.root / "softmax").exists()
    assert any("unknown exercise 'nonsense'" in p for p in sub.problems)


def test_notebook_without_marked_cells_says_how_to_mark_them(tmp_path):
    path = tmp_path / "empty.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("def gelu(x): pass")]), str(path))
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert any("no code cell starting with '# %% exercise: <name>'" in p for p in sub.problems)


@pytest.mark.parametrize("text, message", [
    ("{ not json", "is not valid: it is not JSON"),
    ('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5, "extra": 1}', "is not valid: Additional"),
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}', "is not valid: The notebook is invalid and is missing "
                                                           "an expected key: cells"),
])
def test_malformed_notebooks_are_explained(tmp_path, text, message):
    path = tmp_path / "bad.ipynb"
    path.write_text(text)
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert not sub.usable
    assert any(p.startswith("notebook bad.ipynb") and message in p for p in sub.problems), sub.problems


@pytest.mark.parametrize("name, expected", [
    ("alice smith", "alice_smith"), ("..", "student"), (".", "student"), ("", "student"), ("...", "student"),
    ("../../etc", "etc"), ("grades.csv", "grades.csv"), (".hidden", "hidden"), ("a" * 300, "a" * 64),
    ("x" * 63 + "._y", "x" * 63),
])
def test_student_ids_are_plain_folder_names(name, expected):
    assert submission.sanitize(name) == expected


def test_a_submission_that_is_a_symbolic_link_is_refused_by_name(tmp_path):
    real = _tree(tmp_path / "real")
    (tmp_path / "linky").symlink_to(real, target_is_directory=True)
    sub = submission.prepare(tmp_path / "linky", tmp_path / "work", ALL)
    assert not sub.usable and sub.student == "linky"
    assert sub.problems == [f"linky is a symbolic link (to {real}): links are not graded; hand in the files "
                            "themselves"]
    assert not any((tmp_path / "work").rglob("*.py"))  # nothing was copied from where it points


def test_not_a_submission_is_a_usage_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(submission.SubmissionError, match=r"not a directory, \.zip or \.ipynb"):
        submission.prepare(tmp_path / "notes.txt", tmp_path / "work", ALL)
