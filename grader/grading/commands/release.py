"""``grader release OUT_DIR [--notebooks]``: write what students get.

The release holds

* ``assignments/`` — handouts, stubs and test files;
* ``grader/`` — the public part of the grader that ``pytest assignments/`` needs (specs, checks, pytest
  plugin, speed tests and their thresholds, ``grader list``, ``grader bench``, and ``grader submit`` and
  ``grader results``, :mod:`grader.handin`), copied whole but for the two staff folders (:data:`STAFF_SIDE`): the
  instructor grader with its commands (``grader/grading/``: this module, ``grader calibrate``, which times
  ``solutions/``) and the grading server (``grader/serve/``);
* ``pyproject.toml`` (``pytest`` with no argument runs ``assignments/``), ``scripts/bootstrap.sh`` and
  ``.ci/constraints.txt`` (the install), and a student ``README.md``;
* with ``--notebooks``: ``notebooks/<exercise>.ipynb`` — the handout as markdown, the stub as a code
  cell marked ``# %% exercise: <name>`` (the notebook is also a valid submission), and a cell that
  runs the exercise's tests on that cell.

Nothing else: no ``solutions/``, no ``tests/`` (their known-wrong fixtures are staff material), no
staff scripts. There are no hidden test cases to leave out: the grader draws them per run from a secret.

``assignments/`` is written from the last commit (``git archive HEAD assignments``), never from the working
tree: where the working tree differs from it (a stub solved while trying it out, an uncommitted handout edit)
the command refuses and names the files. Before finishing, the release is checked twice: :func:`audit` — no
file may contain a line of solution code that is not also in a stub, a handout or a public grader file — and
:func:`self_check` — the release's own tests run inside it and every stub must fail with "not implemented".
Either failing fails the command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from importlib.metadata import entry_points
from pathlib import Path

import grader

REPO = Path(grader.__file__).resolve().parent.parent
# The staff side of the grader, left out of a release whole: the instructor grader and its commands, and the grading
# server (its client, grader submit and grader results, is grader/handin, which ships).
STAFF_SIDE = ("grader/grading", "grader/serve")
# How students set up the course's pinned environment: natively on Linux, in the container on macOS and Windows.
STUDENT_ENVIRONMENT = ("scripts/bootstrap.sh", ".ci/constraints.txt", "Dockerfile", ".dockerignore",
                       ".devcontainer/devcontainer.json", "docs/student-environment.md")
_SKIP_NAMES = {"__pycache__", ".pytest_cache", ".hypothesis", ".benchmarks", ".ipynb_checkpoints"}
MIN_AUDIT_LINE = 24  # shorter lines (imports, "return y") are not evidence of a leak


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT_DIR", help="where to write the release (must be empty or absent)")
    parser.add_argument("--notebooks", action="store_true", help="also write one Jupyter notebook per exercise")
    parser.add_argument("--force", action="store_true", help="write into a non-empty OUT_DIR")
    parser.add_argument("--no-self-check", action="store_true",
                        help="skip running the release's tests (every stub must fail with 'not implemented')")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        print(f"grader release: {out} is not empty (use --force to write into it)", file=sys.stderr)
        return 2
    try:
        files = build(out, notebooks=args.notebooks, self_check=not args.no_self_check)
    except ReleaseError as exc:
        print(f"grader release: {exc}", file=sys.stderr)
        return 1
    checked = "" if args.no_self_check else "; its tests ran inside it and every stub failed with 'not implemented'"
    print(f"grader release: wrote {len(files)} files to {out}{checked}", file=sys.stderr)
    return 0


class ReleaseError(Exception):
    pass


def _copy_tree(src: Path, dst: Path, *, skip: tuple[Path, ...] = ()) -> list[Path]:
    written = []
    for item in sorted(src.rglob("*")):
        rel = item.relative_to(src)
        if any(part in _SKIP_NAMES for part in rel.parts) or item.suffix == ".pyc":
            continue
        if any(item == s or s in item.parents for s in skip):
            continue
        if item.is_file() and not item.is_symlink():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item, dst / rel)
            written.append(dst / rel)
    return written


def committed_assignments(repo: Path = REPO) -> bytes:
    """``assignments/`` as of the last commit (a tar archive); :class:`ReleaseError` naming the files where the
    working tree differs from it, or where ``repo`` is no git checkout."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=120)

    try:
        inside = git("rev-parse", "--is-inside-work-tree")
    except FileNotFoundError:
        raise ReleaseError("git is not installed: the release is built from the last commit of assignments/") from None
    if inside.returncode != 0 or inside.stdout.strip() != b"true":
        raise ReleaseError(f"{repo} is not a git checkout: the release is built from the last commit of "
                           "assignments/, so it needs the repository's history")
    status = git("status", "--porcelain", "--untracked-files=all", "--", "assignments")
    if status.returncode != 0:
        raise ReleaseError(f"git status failed: {status.stderr.decode(errors='replace').strip()}")
    changed = [line[3:] for line in status.stdout.decode(errors="replace").splitlines() if line.strip()]
    if changed:
        listed = "\n  ".join(changed[:20]) + (f"\n  ... and {len(changed) - 20} more" if len(changed) > 20 else "")
        raise ReleaseError("assignments/ differs from the last commit, and the release is built from what is "
                           f"committed:\n  {listed}\nUndo what students must not get (a stub you solved while "
                           "trying it out: git stash, or git checkout -- assignments); commit what they should "
                           "(a handout fix); then run grader release again")
    archive = git("archive", "--format=tar", "HEAD", "--", "assignments")
    if archive.returncode != 0:
        raise ReleaseError(f"git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    return archive.stdout


def _extract(archive: bytes, out: Path) -> list[Path]:
    written = []
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            target = (out / member.name).resolve()
            if not member.isfile() or out.resolve() not in target.parents:
                continue  # directories are made below; links and anything outside out are not shipped
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
            written.append(target)
    return written


def build(out: Path, *, notebooks: bool = False, repo: Path = REPO, self_check: bool = True) -> list[Path]:
    """Write the release into ``out`` from the last commit of ``assignments/``, audit it and run its tests;
    returns the files written."""
    from grader import exercises

    archive = committed_assignments(repo)
    out.mkdir(parents=True, exist_ok=True)
    written = _extract(archive, out)
    written += _copy_tree(repo / "grader", out / "grader", skip=tuple(repo / s for s in STAFF_SIDE))
    for rel in STUDENT_ENVIRONMENT:
        if (repo / rel).is_file():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, out / rel)
            written.append(out / rel)
    pyproject = (repo / "pyproject.toml").read_text()
    pyproject = pyproject.replace('testpaths = ["tests"]', 'testpaths = ["assignments"]')
    written.append(_write(out / "pyproject.toml", pyproject))
    all_ex = exercises.all_exercises()
    written.append(_write(out / "README.md", student_readme(all_ex, notebooks)))
    written.append(_write(out / ".gitignore", "__pycache__/\n*.pyc\n.venv/\n.hypothesis/\n.pytest_cache/\n"
                                             ".benchmarks/\nnotebook_impl/\n*.egg-info/\n"))
    if notebooks:
        for exercise in all_ex:  # from the stubs just written: the committed ones
            written.append(write_notebook(out / "notebooks" / f"{exercise.name}.ipynb", exercise, out))
    leaks = audit(out, repo)
    if leaks:
        raise ReleaseError("the release contains solution code:\n  " + "\n  ".join(leaks[:20]))
    if self_check:
        problems = run_self_check(out)
        if problems:
            raise ReleaseError("the release's tests do not show every stub unimplemented:\n  " + "\n  ".join(problems))
    return written


# --------------------------------------------------------------------------------------- self-check


def run_self_check(release: Path, timeout_s: float = 900) -> list[str]:
    """Run the release's tests inside it (its own grader package first on the path) and return what is wrong:
    every exercise must fail with "<function> is not implemented yet", and nothing may error."""
    from grader import exercises

    command = [sys.executable, "-m", "pytest", "assignments", "-q", "-p", "no:cacheprovider", "-m", "not speed"]
    if not any(e.name == "grader" for e in entry_points(group="pytest11")):  # no installed plugin: name it
        command += ["-p", "grader.pytest_plugin.plugin"]
    env = {**os.environ, "PYTHONPATH": str(release.resolve())}
    try:
        proc = subprocess.run(command, cwd=release, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [f"the release's tests did not finish in {timeout_s:.0f} s"]
    finally:  # pytest-benchmark's folder, empty when no speed test ran: not part of what students get
        with contextlib.suppress(OSError):
            (release / ".benchmarks").rmdir()
    out = proc.stdout + proc.stderr
    tail = "\n    ".join(out.strip().splitlines()[-15:])
    problems = []
    if proc.returncode != 1 or " error" in (proc.stdout.strip().splitlines() or [""])[-1]:
        problems.append(f"pytest exited with status {proc.returncode} (expected 1: failures, no errors):\n    {tail}")
    for exercise in exercises.all_exercises():
        needle = f"is not implemented yet — see assignments/{exercise.name}/README.md"
        if needle not in out:
            problems.append(f"assignments/{exercise.name}: its stub did not fail with '{needle}' (is it solved, "
                            "or broken?)")
    return problems


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -------------------------------------------------------------------------------------------- audit


def solution_lines(repo: Path = REPO) -> dict[str, str]:
    """Distinctive lines of the reference solutions -> "solutions/<file>:<line>": code lines of at least
    MIN_AUDIT_LINE characters that no stub, handout or public grader file contains (so shared
    boilerplate, a kernel signature, a constant the spec also defines, or a snippet a handout teaches
    is not evidence of a leak)."""
    public: set[str] = set()
    for path in (repo / "assignments").rglob("*"):
        if path.suffix in (".py", ".md", ".txt") and path.is_file():  # stubs, tests and handouts (their snippets)
            public.update(_lines(path.read_text()))
    staff = tuple(repo / s for s in STAFF_SIDE)
    for path in (repo / "grader").rglob("*.py"):
        if not any(path == s or s in path.parents for s in staff):
            public.update(_lines(path.read_text()))
    found: dict[str, str] = {}
    for path in sorted((repo / "solutions").rglob("*.py")):
        rel = path.relative_to(repo / "solutions")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            text = line.strip()
            if len(text) >= MIN_AUDIT_LINE and not text.startswith("#") and text not in public:
                found.setdefault(text, f"solutions/{rel}:{number}")
    return found


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def audit(release: Path, repo: Path = REPO) -> list[str]:
    """Every place where the release holds a distinctive line of a solution, or a solutions/ path."""
    distinctive = solution_lines(repo)
    leaks = []
    for path in sorted(release.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(release)
        if "solutions" in rel.parts:
            leaks.append(f"{rel}: a solutions/ path")
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits = _notebook_hits(text, distinctive) if path.suffix == ".ipynb" else set(_lines(text)) & distinctive.keys()
        leaks.extend(f"{rel}: {line[:80]!r} (from {distinctive[line]})" for line in sorted(hits))
    return leaks


def _notebook_hits(text: str, distinctive: dict[str, str]) -> set[str]:
    import json

    try:
        cells = json.loads(text).get("cells", [])
    except (ValueError, AttributeError):
        return set()
    lines = set()
    for cell in cells:
        source = cell.get("source", "")
        lines.update(_lines("".join(source) if isinstance(source, list) else str(source)))
    return lines & distinctive.keys()


# ---------------------------------------------------------------------------------------- notebooks

_SETUP = '''\
# Run first: picks the GPU, or the Triton interpreter on a CPU (TRITON_INTERPRET must be set before triton is
# imported, so restart the kernel if you imported triton earlier).
from grader.checks import runtime

print(runtime.configure().description)'''

_TEST_CELL = '''\
# Runs the tests on the last version of the exercise cell you ran (run that cell first, then this one).
import pathlib
import subprocess
import sys

MARKER, EXERCISE, MODULE = "# %% exercise: {name}", "{name}", "{module}"
source = next((cell for cell in reversed(globals().get("In", [])) if cell.lstrip().startswith(MARKER)), None)
if source is None:
    raise RuntimeError(f"run the cell that starts with {{MARKER!r}} first")
root = pathlib.Path.cwd()
while not (root / "assignments").is_dir() and root != root.parent:
    root = root.parent
impl = root / "notebook_impl"
(impl / EXERCISE).mkdir(parents=True, exist_ok=True)
(impl / EXERCISE / f"{{MODULE}}.py").write_text(source)
result = subprocess.run([sys.executable, "-m", "pytest", str(root / "assignments" / EXERCISE), "--impl", str(impl),
                         "-q", "-p", "no:cacheprovider"], cwd=root, capture_output=True, text=True)
print(result.stdout[-20000:], result.stderr[-5000:])'''


def notebook(exercise, repo: Path = REPO):
    """The exercise as a notebook: handout, setup cell, stub cell (the submission), test cell; the stub and
    handout are read from ``repo/assignments``."""
    import nbformat
    from nbformat import v4

    stub = (repo / "assignments" / exercise.name / f"{exercise.module}.py").read_text()
    handout_path = repo / "assignments" / exercise.name / "README.md"
    handout = handout_path.read_text() if handout_path.is_file() else f"# {exercise.title}\n"
    cells = [
        v4.new_markdown_cell(handout),
        v4.new_markdown_cell(
            "## Your solution\n\nWrite your kernel in the cell below. Keep its first line "
            f"`# %% exercise: {exercise.name}`: it tells the test cell and the grader which exercise the cell is. "
            "You may split your code over several cells that start with that line; they are joined in order. "
            "Hand in this notebook as it is."
        ),
        v4.new_code_cell(_SETUP),
        v4.new_code_cell(f"# %% exercise: {exercise.name}\n{stub.rstrip()}\n"),
        v4.new_markdown_cell("## Test it\n\nRun the cell above, then this one: it runs "
                             f"`pytest assignments/{exercise.name}` on that cell's code."),
        v4.new_code_cell(_TEST_CELL.format(name=exercise.name, module=exercise.module)),
    ]
    nb = v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "grader": {"exercise": exercise.name},
    })
    nbformat.validate(nb)
    return nb


def write_notebook(path: Path, exercise, repo: Path = REPO) -> Path:
    import nbformat

    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook(exercise, repo), str(path))
    return path


# ------------------------------------------------------------------------------------------- readme


def student_readme(all_exercises, notebooks: bool) -> str:
    rows = "\n".join(f"| {i} | `{e.name}` | {e.title} | `assignments/{e.name}/README.md` |"
                     for i, e in enumerate(all_exercises, 1))
    nb = ""
    if notebooks:
        nb = ("\n## Notebooks\n\n`notebooks/<exercise>.ipynb` holds each exercise as a notebook: the handout, the "
              "stub in a cell starting with `# %% exercise: <name>`, and a cell that runs the tests on it. "
              "You can hand in the notebook instead of the `.py` file.\n")
    return f"""# Triton kernel programming: exercises

Write GPU kernels in Triton, exercise by exercise. Each exercise has a handout (`README.md`), a stub to fill in
and its tests. The tests run on a GPU, or on any CPU through the Triton interpreter.

| # | exercise | what | handout |
|---|---|---|---|
{rows}

## Set up

    bash scripts/bootstrap.sh        # creates .venv (on a machine without a GPU, first:
                                     # export TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu")
    source .venv/bin/activate

It installs the Triton the course grades with (the versions are in `.ci/constraints.txt`). Triton runs on Linux
only: on macOS or Windows, use the course's container (`Dockerfile`, or `.devcontainer/` in VS Code or GitHub
Codespaces); `docs/student-environment.md` says how.

## Work

Edit `assignments/<exercise>/<exercise>.py`, then run its tests:

    pytest assignments/gelu          # one exercise
    pytest                           # all of them

An untouched stub fails with one short message ("... is not implemented yet"). A wrong kernel gets the smallest
failing case: shape, dtype, strides, error statistics and the first mismatching elements. Without a GPU the
kernels run in the Triton interpreter (the test header says so); speed tests run on a GPU only.

Rules the tests (and the grader) enforce: the call must launch a Triton kernel defined in your module; it must not
compute with PyTorch ops (allocation, views, copies and dtype casts are fine); it must not modify its inputs or
return memory shared with them; it must compute its result on every call. The grader also runs cases you have not
seen (the same kinds of shapes, dtypes and layouts as the tests, with other values).
{nb}
## Hand in

The `assignments/` folder (or a .zip of it) with your modules, or the notebooks.
"""
