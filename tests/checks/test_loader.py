"""Loading a student's module (grader.checks.loader): a syntax error is named by the line the student wrote (a
notebook's by its cell and the line in that cell), and a module is read in the source encoding it declares."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from grader import exercises
from grader.checks import loader
from grader.grading.batch import submission

ALL = exercises.all_exercises()
GELU = exercises.get("gelu")


def _tree(root: Path, body: str = "def gelu(x):\n    return x\n") -> Path:
    (root / "gelu").mkdir(parents=True)
    (root / "gelu" / "gelu.py").write_text(body)
    return root


def test_a_syntax_error_in_a_notebook_names_the_cell_and_its_own_line(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("intro"),
        nbformat.v4.new_code_cell("# %% exercise: gelu\nimport torch\n\ndef helper(x):\n    return x\n"),
        nbformat.v4.new_code_cell("print('not graded')"),
        nbformat.v4.new_code_cell("# %% exercise: gelu\ndef gelu(x):\n    return helper(x\n"),
    ])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    sub = submission.prepare(path, tmp_path / "work", ALL)
    with pytest.raises(loader.LoadError) as raised:
        loader.load(sub.root, GELU, ("gelu",))
    message = str(raised.value)
    assert raised.value.kind == "syntax"
    assert message.startswith("notebook cell 4 has a syntax error at line 3 of that cell:"), message
    assert "gelu.py" not in message  # a file the student never wrote


def test_a_syntax_error_in_a_file_names_its_line(tmp_path):
    _tree(tmp_path / "t", "import torch\n\ndef gelu(x):\n    return (x\n")
    with pytest.raises(loader.LoadError, match=r"^gelu.py has a syntax error at line 4: '\(' was never closed"):
        loader.load(tmp_path / "t", GELU, ("gelu",))


def test_a_declared_source_encoding_is_honoured(tmp_path):
    root = tmp_path / "latin"
    (root / "gelu").mkdir(parents=True)
    (root / "gelu" / "gelu.py").write_bytes(b"# -*- coding: latin-1 -*-\nNAME = 'caf\xe9'\n\ndef gelu(x):\n"
                                            b"    return x\n")
    module = loader.load(root, GELU, ("gelu",))
    assert module.NAME == "café"
    bare = tmp_path / "bare"
    (bare / "gelu").mkdir(parents=True)
    (bare / "gelu" / "gelu.py").write_bytes(b"NAME = 'caf\xe9'\n\ndef gelu(x):\n    return x\n")
    with pytest.raises(loader.LoadError, match=r"gelu.py cannot be read as text .*save it as UTF-8, or declare its "
                                                r"encoding .*PEP 263"):
        loader.load(bare, GELU, ("gelu",))
