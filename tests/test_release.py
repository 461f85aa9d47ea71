"""``grader release``: the student release holds what ``pytest assignments/`` needs, no solution code and no
staff material, its tests run inside it (every stub: "not implemented"), and its notebooks are valid
submissions whose test cell works.

The release is run with its own ``grader`` package: the development checkout is installed in editable
mode, so the subprocesses drop that install's import hook and put the release first on ``sys.path``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grader import cli, exercises
from grader.grading import release as release_mod
from grader.grading import submission

REPO = Path(__file__).resolve().parent.parent
BOOT = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
        "if 'Editable' not in getattr(f, '__name__', type(f).__name__)]; sys.path.insert(0, sys.argv.pop(1)); ")


def _python(release: Path, code: str, *args: str, cwd: Path | None = None, timeout: int = 300):
    return subprocess.run([sys.executable, "-c", BOOT + code, str(release), *args], cwd=cwd or release,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release") / "course"
    assert cli.main(["release", str(out), "--notebooks"]) == 0
    return out


def test_release_holds_what_students_need(release):
    for exercise in exercises.all_exercises():
        folder = release / "assignments" / exercise.name
        assert (folder / f"{exercise.module}.py").is_file() and (folder / f"test_{exercise.name}.py").is_file()
        assert (release / "notebooks" / f"{exercise.name}.ipynb").is_file()
    for rel in ("grader/pytest_plugin/plugin.py", "grader/checks/verdicts.py", "grader/exercises/gelu.py",
                "pyproject.toml", "README.md",
                "scripts/bootstrap.sh"):
        assert (release / rel).is_file(), rel
    assert 'testpaths = ["assignments"]' in (release / "pyproject.toml").read_text()


def test_release_has_no_solutions_tests_or_instructor_grader(release):
    names = {p.relative_to(release).as_posix() for p in release.rglob("*")}
    assert not any(n.startswith(("solutions", "tests", "grader/grading")) for n in names)
    assert "grader/speed/calibrate.py" not in names
    solutions = {p.read_bytes() for p in (REPO / "solutions").rglob("*.py")}
    assert not any(p.is_file() and p.read_bytes() in solutions for p in release.rglob("*"))
    assert release_mod.audit(release) == []
    assert len(release_mod.solution_lines()) > 50  # the audit looks for something


def test_audit_catches_solution_code_anywhere(release, tmp_path):
    copy = tmp_path / "leaky"
    shutil.copytree(release, copy)
    shutil.copy(REPO / "solutions" / "softmax" / "softmax.py", copy / "grader" / "helpers.py")
    nb = nbformat.read(str(copy / "notebooks" / "gelu.ipynb"), as_version=4)
    nb.cells[3].source = "# %% exercise: gelu\n" + (REPO / "solutions" / "gelu" / "gelu.py").read_text()
    nbformat.write(nb, str(copy / "notebooks" / "gelu.ipynb"))
    leaks = release_mod.audit(copy)
    assert any(leak.startswith("grader/helpers.py:") and "solutions/softmax/softmax.py" in leak for leak in leaks)
    assert any(leak.startswith("notebooks/gelu.ipynb:") for leak in leaks)


def test_pytest_assignments_runs_inside_the_release(release):
    where = _python(release, "import grader; print(grader.__file__)")
    assert where.stdout.strip() == str(release / "grader" / "__init__.py"), where.stderr
    result = _python(release, "import pytest; sys.exit(pytest.main(sys.argv[1:]))", "assignments", "-q",
                     "-p", "no:cacheprovider")
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr[-3000:]
    assert "error" not in out.splitlines()[-1], out[-3000:]  # failures, not collection errors
    for exercise in exercises.all_exercises():
        assert f"{exercise.parts[0].functions[0]} is not implemented yet — see assignments/{exercise.name}/README.md" \
            in out or "not implemented yet" in out
    assert out.count("is not implemented yet") >= len(exercises.all_exercises())


def test_release_cli_has_the_student_commands_only(release):
    listed = _python(release, "from grader import cli; sys.exit(cli.main(sys.argv[1:]))", "list")
    assert listed.returncode == 0 and "gelu" in listed.stdout
    grade = _python(release, "from grader import cli; sys.exit(cli.main(sys.argv[1:]))", "grade", "x")
    assert grade.returncode == 2 and "invalid choice: 'grade'" in grade.stderr


def test_notebooks_are_submissions_and_their_test_cell_runs(release):
    path = release / "notebooks" / "gelu.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    modules, problems = submission.notebook_modules(nb, exercises.all_exercises())
    assert problems == [] and set(modules) == {"gelu"}
    assert "raise NotImplementedError" in modules["gelu"]
    stub_cell = next(c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith("# %% exercise:"))
    test_cell = nb.cells[-1].source
    result = _python(release, "exec(sys.argv[2], {'In': [sys.argv[1]]})", stub_cell, test_cell,
                     cwd=release / "notebooks")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "gelu is not implemented yet" in result.stdout, result.stdout[-3000:]
    assert (release / "notebook_impl" / "gelu" / "gelu.py").read_text() == stub_cell


def test_release_refuses_a_non_empty_directory(tmp_path, capsys):
    (tmp_path / "something").write_text("x")
    assert cli.main(["release", str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err
