"""The course's environment is stated once and holds together: the Triton the course grades with
(``runtime.COURSE_TRITON``) is the one ``.ci/constraints.txt`` pins; the container (``Dockerfile``,
``.devcontainer/``) installs what ``scripts/bootstrap.sh`` does; bootstrap refuses, with directions, the platforms
Triton has no wheels for; and where another Triton runs, the test header and the grade reports say so. Static and
fast: nothing is built or installed here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import triton

from grader.checks import runtime
from grader.grading.results import reports
from grader.pytest_plugin import plugin

ROOT = Path(__file__).resolve().parents[2]
DOC = "docs/student-environment.md"
MISMATCH = "CPU via the Triton interpreter (TRITON_INTERPRET=1); torch 2.13.0+cpu, triton 3.9.0"


def _pins(text: str) -> dict[str, str]:
    """name -> version of every ``name==version`` in the text (requirement lines, or pip commands)."""
    return {m[1].lower(): m[2] for m in re.finditer(r"([A-Za-z0-9_.-]+)==([\w.+]+)", text)}


def _dockerfile() -> tuple[str, dict[str, str]]:
    """The Dockerfile's text with its ARG defaults substituted, and those defaults."""
    text = (ROOT / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m[1], m[0]), text), args


def _bootstrap_torch() -> str:
    """The torch bootstrap installs on a machine without an NVIDIA GPU (the container's case)."""
    found = re.search(r"^  default_torch=([\w.]+)$", (ROOT / "scripts" / "bootstrap.sh").read_text(), re.M)
    assert found, "scripts/bootstrap.sh no longer sets default_torch"
    return found[1]


def test_the_course_triton_is_the_one_the_constraints_pin():
    pins = _pins((ROOT / ".ci" / "constraints.txt").read_text())
    assert pins["triton"] == runtime.COURSE_TRITON


def test_the_dockerfile_installs_what_bootstrap_does():
    text, args = _dockerfile()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert args["TORCH_VERSION"] == _bootstrap_torch()
    assert re.search(r'pip install [^\n]*"torch==[\w.]+" --index-url "https://download\.pytorch\.org/whl/cpu"', text)
    assert re.search(r"^RUN pip install [^\n]*-c \.ci/constraints\.txt -e \.$", text, re.M)
    assert re.search(r"^COPY \.ci/constraints\.txt \.ci/$", text, re.M)
    constraints = _pins((ROOT / ".ci" / "constraints.txt").read_text())
    pins = _pins(text)
    assert pins.pop("torch") == _bootstrap_torch()
    assert {name: constraints.get(name) for name in pins} == pins  # anything else it pins, it pins as CI does
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ".venv" in ignored and ".git" in ignored


def test_the_devcontainer_builds_the_dockerfile_and_installs_the_workspace():
    config = json.loads((ROOT / ".devcontainer" / "devcontainer.json").read_text())
    folder = ROOT / ".devcontainer"
    assert (folder / config["build"]["dockerfile"]).resolve() == ROOT / "Dockerfile"
    assert (folder / config["build"]["context"]).resolve() == ROOT
    # the workspace is mounted where the image did not install the project: the editable install must follow it
    assert "--no-deps -e ." in config["postCreateCommand"]
    assert config["customizations"]["vscode"]["settings"]["python.testing.pytestArgs"] == ["assignments"]


@pytest.mark.parametrize("system", ["Darwin", "MINGW64_NT-10.0-19045", "Linux"])
def test_bootstrap_refuses_platforms_without_triton_wheels(tmp_path, system):
    """A fake ``uname`` on the PATH; ``PYTHON=false``, so that past the check the script fails at once instead of
    installing anything (and it runs in a copy: a regression cannot touch this checkout's .venv)."""
    copy = tmp_path / "course"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "bootstrap.sh", copy / "scripts" / "bootstrap.sh")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uname").write_text(f"#!/bin/sh\necho {system}\n")
    (fake / "uname").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "PYTHON": "false"}
    done = subprocess.run(["bash", "scripts/bootstrap.sh"], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert not (copy / ".venv").exists()
    refused = f"Triton has no wheels for {system}" in done.stderr and DOC in done.stderr
    assert refused == (system != "Linux"), done.stderr


def test_the_container_is_documented_where_students_look():
    doc = (ROOT / DOC).read_text()
    assert f"triton` | {runtime.COURSE_TRITON}" in doc and f"torch {_bootstrap_torch()}" in doc
    assert "docker build -t triton-course ." in doc
    students = (ROOT / "README.md").read_text().split("## Students", 1)[1].split("\n## ", 1)[0]
    assert DOC in students
    handouts = sorted((ROOT / "assignments").glob("*/README.md"))
    assert handouts and [h.parent.name for h in handouts if DOC not in h.read_text()] == []


@pytest.mark.parametrize(("version", "why"), [("3.9.0", " (block pointers were removed in 3.9)"), ("3.7.1", "")])
def test_version_note_names_a_triton_other_than_the_courses(monkeypatch, version, why):
    monkeypatch.setattr(triton, "__version__", version)
    assert runtime.version_note() == (
        f"this machine runs triton {version}; the course grades with triton {runtime.COURSE_TRITON} — results may "
        f"differ{why}; `bash scripts/bootstrap.sh` installs the course's version")


@pytest.mark.parametrize("build", ["", "+git1234abcd"])
def test_version_note_is_silent_on_the_courses_triton(monkeypatch, build):
    monkeypatch.setattr(triton, "__version__", runtime.COURSE_TRITON + build)
    assert runtime.version_note() is None


def test_version_note_reads_a_recorded_description():
    assert "runs triton 3.9.0" in (runtime.version_note(MISMATCH) or "")
    assert runtime.version_note(MISMATCH.replace("3.9.0", runtime.COURSE_TRITON)) is None
    assert runtime.version_note("CPU through Slurm") is None  # names no version: nothing to say


@pytest.mark.parametrize("version", ["3.9.0", runtime.COURSE_TRITON])
def test_the_session_header_notes_another_triton(pytestconfig, monkeypatch, version):
    monkeypatch.setattr(triton, "__version__", version)
    notes = [line for line in plugin.pytest_report_header(pytestconfig) if line.startswith("grader: note:")]
    if version == runtime.COURSE_TRITON:
        assert notes == []
    else:
        assert notes == [f"grader: note: {runtime.version_note()}"]
        assert "this machine runs triton 3.9.0" in notes[0]


@pytest.mark.parametrize("device", [MISMATCH, MISMATCH.replace("3.9.0", runtime.COURSE_TRITON)])
def test_a_report_says_when_the_workers_ran_another_triton(device):
    report = reports.StudentReport("ada", "ada.zip", "zip", [], device, sandbox="in a bubblewrap 0.11.0 sandbox")
    texts = [reports.markdown(report), reports.render_html(report), reports.gradescope(report)["output"]]
    noted = [f"the course grades with triton {runtime.COURSE_TRITON}" in t for t in texts]
    if "3.9.0" in device:
        assert noted == [True, True, True]
        assert report.graded_with == f"{device}, in a bubblewrap 0.11.0 sandbox (note: {runtime.version_note(device)})"
        assert "this machine runs triton 3.9.0" in report.graded_with
    else:
        assert noted == [False, False, False]
        assert report.graded_with == f"{device}, in a bubblewrap 0.11.0 sandbox"
