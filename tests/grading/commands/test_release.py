"""``grader release``: the student release holds what ``pytest assignments/`` needs, no solution code and no
staff material; its stubs come from the last commit (a solved stub in the working tree is refused, by name); its
tests run inside it (every stub: "not implemented", and a solved one is caught); its notebooks are valid
submissions whose test cell works.

The release is run with its own ``grader`` package, first on the path (``PYTHONPATH``); the development checkout
is installed in editable mode, so the subprocesses drop that install's import hook (it would supply the modules
the release leaves out).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grader import cli, exercises
from grader.grading.batch import submission
from grader.grading.commands import release as release_mod

REPO = Path(__file__).resolve().parents[3]
BOOT = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
        "if 'Editable' not in getattr(f, '__name__', type(f).__name__)]; ")


def _python(release: Path, code: str, *args: str, cwd: Path | None = None, timeout: int = 300):
    return subprocess.run([sys.executable, "-c", BOOT + code, *args], cwd=cwd or release,
                          env={**os.environ, "PYTHONPATH": str(release)}, capture_output=True, text=True,
                          timeout=timeout)


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
                "scripts/bootstrap.sh", "Dockerfile", ".devcontainer/devcontainer.json",
                "docs/student-environment.md"):
        assert (release / rel).is_file(), rel
    named = {doc for handout in (release / "assignments").glob("*/README.md")  # where the handouts send students
             for doc in re.findall(r"`(docs/[\w.-]+\.md)`", handout.read_text())}
    assert "docs/student-environment.md" in named
    assert all((release / doc).is_file() for doc in named), named
    assert 'testpaths = ["assignments"]' in (release / "pyproject.toml").read_text()
    assert not (release / ".benchmarks").exists()  # the self-check's pytest run leaves nothing behind


def test_release_has_no_solutions_tests_or_instructor_grader(release):
    names = {p.relative_to(release).as_posix() for p in release.rglob("*")}
    assert not any(n.startswith(("solutions", "tests", "grader/grading")) for n in names)
    assert "grader/grading/commands/calibrate.py" not in names
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


def test_the_release_runs_its_own_grader_and_its_tests_show_every_stub_unimplemented(release):
    where = _python(release, "import grader; print(grader.__file__)")
    assert where.stdout.strip() == str(release / "grader" / "__init__.py"), where.stderr
    # the release fixture's `grader release` ran the release's tests (its self-check) and they passed it
    assert release_mod.run_self_check(release) == []


def test_the_self_check_catches_a_solved_stub(release, tmp_path):
    copy = tmp_path / "solved"
    shutil.copytree(release, copy)
    shutil.copy(REPO / "solutions" / "softmax" / "softmax.py", copy / "assignments" / "softmax" / "softmax.py")
    problems = release_mod.run_self_check(copy)
    assert len(problems) == 1 and problems[0].startswith("assignments/softmax: its stub did not fail"), problems


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_release_is_built_from_the_last_commit_and_refuses_a_solved_stub(tmp_path):
    repo = tmp_path / "course"
    for rel in ("assignments", "grader"):
        shutil.copytree(REPO / rel, repo / rel, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "course")
    stub = repo / "assignments" / "gelu" / "gelu.py"
    stub.write_text((REPO / "solutions" / "gelu" / "gelu.py").read_text())  # solved while trying it out
    (repo / "assignments" / "gelu" / "notes.txt").write_text("scratch")
    with pytest.raises(release_mod.ReleaseError) as refused:
        release_mod.build(tmp_path / "out", repo=repo, self_check=False)
    message = str(refused.value)
    assert "assignments/ differs from the last commit" in message and "a stub you solved" in message
    assert "assignments/gelu/gelu.py" in message and "assignments/gelu/notes.txt" in message
    assert not (tmp_path / "out").exists()
    _git(repo, "checkout", "--", "assignments")
    (repo / "assignments" / "gelu" / "notes.txt").unlink()
    release_mod.build(tmp_path / "out", repo=repo, self_check=False)
    assert (tmp_path / "out" / "assignments" / "gelu" / "gelu.py").read_bytes() == (
        REPO / "assignments" / "gelu" / "gelu.py").read_bytes()
    with pytest.raises(release_mod.ReleaseError, match="is not a git checkout"):
        release_mod.committed_assignments(tmp_path / "out")


def test_release_cli_has_the_student_commands_only(release):
    listed = _python(release, "from grader import cli; sys.exit(cli.main(sys.argv[1:]))", "list")
    assert listed.returncode == 0 and "gelu" in listed.stdout
    grade = _python(release, "from grader import cli; sys.exit(cli.main(sys.argv[1:]))", "grade", "x")
    assert grade.returncode == 2 and "invalid choice: 'grade'" in grade.stderr


def test_notebooks_are_submissions_and_their_test_cell_runs(release):
    path = release / "notebooks" / "gelu.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    modules, problems = submission.notebook_modules(nb.cells, exercises.all_exercises())
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
