"""The newcomer's path: CI runs every command the README gives students, course staff and instructors, as
written and in order, right after the README's set-up command (``.ci/readme.py``, called by ``.ci/run``), and
fails where one does not do what the README says. Here: the README's commands are all known to that runner and
pasteable as they stand (no placeholders), ``.ci/run`` calls it after the set-up command, and the students'
commands run as written in a scratch copy of the checkout."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / ".ci" / "readme.py"


def _runner(*args: str, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUNNER), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_every_readme_command_is_known_to_the_runner_and_pasteable():
    listed = _runner("--dry-run")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    lines = listed.stdout.splitlines()
    commands = [line.split("]", 1)[1].split("  ->  ")[0].strip() for line in lines]
    assert {"Students", "Course staff", "Instructors"} == {line[1:].split("]")[0] for line in lines}
    for needed in ("bash scripts/bootstrap.sh", "source .venv/bin/activate", "pytest assignments/gelu",
                   "grader release course-release --notebooks", "grader bench flash_attention --impl solutions "
                   "--leaderboard", "pytest -m gpu"):
        assert needed in commands, needed
    assert commands.index("source .venv/bin/activate") < commands.index("pytest assignments/gelu")
    for command in commands:  # pasteable as written: no placeholders or optional brackets
        assert not re.search(r"\.\.\.|\[|\]|OUT_DIR|SUBMISSION|<", command), command


def test_ci_runs_the_readme_commands_right_after_the_set_up_command():
    steps = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    setup = next(i for i, line in enumerate(steps) if "bash scripts/bootstrap.sh" in line)
    runner = next(i for i, line in enumerate(steps) if ".ci/readme.py" in line)
    tests = next(i for i, line in enumerate(steps) if "pytest --hypothesis-profile ci" in line)
    assert setup < runner < tests
    assert ".ci/readme.py" in steps[runner] and "--sections" not in steps[runner]  # every section, as written


def test_the_students_commands_run_as_written(tmp_path):
    """The students' section for real, in a copy of the checkout that has only what git tracks (a fresh clone's
    files) and this environment's .venv."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    clone = tmp_path / "clone"
    for rel in files:
        if (ROOT / rel).is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, clone / rel)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    result = _runner("--workdir", str(clone), "--sections", "Students", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pytest assignments/gelu: exit 1" in result.stdout and "every one as the README says" in result.stdout
