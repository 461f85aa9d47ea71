"""Turn what a student hands in into an implementation tree laid out like ``assignments/``.

A submission is one of

* a directory laid out like ``assignments/`` (``<exercise>/<module>.py``), or containing one
  (``assignments/`` inside it, or a single top-level folder);
* a ``.zip`` of such a directory;
* a Jupyter notebook (``.ipynb``) whose code cells define the modules: every code cell whose first
  line is ``# %% exercise: <name>`` belongs to exercise ``<name>``; an exercise's cells, in order, form
  its module. Other cells are ignored. IPython magics (lines starting with ``%`` or ``!``) are
  commented out.

The student id is the directory or file name without extension, unless the submission carries a
manifest: ``student.toml`` with ``student_id = "..."`` next to the exercise folders or at the top
(directories, zips), or the notebook
metadata ``{"grader": {"student_id": "..."}}``. Ids are reduced to ``[A-Za-z0-9._-]`` (see :func:`sanitize`). The
same places may hold ``display_name``: the name a student opts into for the class's speed leaderboard.

A folder that holds submissions rather than exercise folders (several student folders, zips or notebooks)
stands for the submissions in it: ``grader grade export/`` grades every one.

Everything is copied into a private directory first (regular files only: links are skipped), so grading never
runs in, or writes to, the submitted files. What cannot be student code (virtual environments, caches, build
output, files too large to be a module: :mod:`grader.grading.batch.skipping`) is neither copied nor unpacked, and
is named in a note among the submission's problems; the file-count and size limits apply to what is kept. A
submission that is itself a symbolic link is not followed: it is refused, with a message naming it.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tomllib
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from grader.checks import loader
from grader.checks.spec import Exercise
from grader.grading.batch import notebook_reader, skipping
from grader.grading.batch.skipping import BOMB_RATIO, MAX_BYTES, Entry

MARKER = re.compile(r"^\s*#\s*%%\s*exercise:\s*(\S+)\s*$")
MANIFEST = "student.toml"
MAX_ID = 64  # characters of a student id: a folder name, far below any file system's limit


@dataclass
class Submission:
    student: str
    source: Path
    kind: str  # "directory" | "zip" | "notebook"
    root: Path | None = None  # the implementation tree; None when nothing in it can be graded
    problems: list[str] = field(default_factory=list)  # what is wrong with the submission as a whole
    display_name: str | None = None  # opted into for the leaderboard (manifest or notebook metadata)

    @property
    def usable(self) -> bool:
        return self.root is not None


class SubmissionError(Exception):
    """The submission cannot be read at all (the message says why)."""


def sanitize(name: str) -> str:
    """A student id that is a plain folder name: ``[A-Za-z0-9._-]``, at most MAX_ID characters, neither
    starting nor ending with ``.``, ``_`` or ``-`` (so never ``.``, ``..`` nor hidden); "student" when nothing
    is left. Ids live in ``OUT/students/<id>/``, so they cannot collide with the grader's own files."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")
    return cleaned[:MAX_ID].rstrip("._-") or "student"


def kind_of(path: Path) -> str:
    if path.is_dir():
        return "directory"
    if path.suffix.lower() == ".zip":
        return "zip"
    if path.suffix.lower() == ".ipynb":
        return "notebook"
    raise SubmissionError(f"{path}: not a directory, .zip or .ipynb")


def is_batch(path: Path, exercises: tuple[Exercise, ...]) -> bool:
    """A folder of submissions (e.g. a course site's export), rather than one submission: no exercise
    module at its top or in its ``assignments/``, and either several entries that look like submissions
    or a .zip/.ipynb among them."""
    if not path.is_dir() or find_root(path, exercises, depth=0) or (path / "assignments").is_dir():
        return False
    entries = [p for p in path.iterdir() if not p.name.startswith(".") and not skipping.skipped_name(p.name)]
    looks = [p for p in entries if p.is_dir() or p.suffix.lower() in (".zip", ".ipynb")]
    return len(looks) >= 2 or any(p.suffix.lower() in (".zip", ".ipynb") for p in looks)


def expand(paths: list[Path], exercises: tuple[Exercise, ...]) -> list[Path]:
    """The submissions named by ``paths``: a folder of submissions stands for its entries."""
    out = []
    for path in paths:
        if is_batch(path, exercises):
            out.extend(sorted(p for p in path.iterdir() if not p.name.startswith(".")
                              and not skipping.skipped_name(p.name)
                              and (p.is_dir() or p.suffix.lower() in (".zip", ".ipynb"))))
        else:
            out.append(path)
    return out


def default_id(path: Path) -> str:
    return sanitize(path.name if path.is_dir() else path.stem)


def prepare(path: Path, dest: Path, exercises: tuple[Exercise, ...]) -> Submission:
    """Copy/extract ``path`` into ``dest`` and find its implementation tree; problems are recorded on
    the returned Submission, never raised (except for a path that is not a submission at all)."""
    path = Path(path)
    kind = kind_of(path)
    sub = Submission(default_id(path), path, kind)
    dest.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():  # what it points to is not the student's hand-in (it could be solutions/)
        sub.problems.append(f"{path.name} is a symbolic link (to {os.readlink(path)}): links are not graded; hand "
                            "in the files themselves")
        return sub
    try:
        if kind == "notebook":
            sub.root = _from_notebook(path, dest / "impl", exercises, sub)
        else:
            tree = dest / "files"
            modules = {(e.name, f"{e.module}.py") for e in exercises}
            if kind == "zip":
                _extract_zip(path, tree, sub, modules)
            else:
                _copy_tree(path, tree, sub, modules)
            sub.root = find_root(tree, exercises)
            for folder in (tree, sub.root, sub.root.parent if sub.root else None):
                if folder is not None and (folder / MANIFEST).is_file():
                    sub.student = _manifest_id(folder / MANIFEST, sub) or sub.student
                    break
            if sub.root is None:
                names = ", ".join(f"{e.name}/{e.module}.py" for e in exercises)
                sub.problems.append(f"{path.name}: no exercise module found (expected files like {names})")
                sub.root = tree  # every exercise is then "not submitted"
    except SubmissionError as exc:
        sub.problems.append(str(exc))
        sub.root = None
    return sub


def _manifest_id(manifest: Path, sub: Submission) -> str | None:
    try:
        data = tomllib.loads(manifest.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        sub.problems.append(f"{MANIFEST} is not valid TOML ({exc}); using the id {sub.student!r}")
        return None
    sub.display_name = display_name(data.get("display_name"))
    value = data.get("student_id")
    return sanitize(str(value)) if value else None


def display_name(value) -> str | None:
    """A printable name of at most 40 characters, or None."""
    if not isinstance(value, str):
        return None
    text = "".join(ch for ch in value if ch.isprintable()).strip()[:40]
    return text or None


def find_root(tree: Path, exercises: tuple[Exercise, ...], depth: int = 2) -> Path | None:
    """The folder holding ``<exercise>/<module>.py`` files: ``tree`` itself, its ``assignments/``, or
    (for a zipped folder) its only subfolder."""
    if any((tree / e.name / f"{e.module}.py").is_file() for e in exercises):
        return tree
    if depth == 0:
        return None
    if (tree / "assignments").is_dir():
        found = find_root(tree / "assignments", exercises, depth - 1)
        if found:
            return found
    subdirs = [d for d in tree.iterdir()
               if d.is_dir() and not skipping.skipped_name(d.name) and not d.name.startswith(".")]
    if len(subdirs) == 1:
        return find_root(subdirs[0], exercises, depth - 1)
    return None


def _copy_tree(src: Path, dst: Path, sub: Submission, modules: set[tuple[str, str]]) -> None:
    entries = []
    for folder, dirs, files in os.walk(src):  # links to folders are listed, never followed
        dirs.sort()
        for name in dirs + sorted(files):
            item = Path(folder, name)
            info = item.lstat()
            kind = ("link" if stat.S_ISLNK(info.st_mode) else "dir" if stat.S_ISDIR(info.st_mode)
                    else "file" if stat.S_ISREG(info.st_mode) else "other")
            entries.append(Entry(PurePosixPath(*item.relative_to(src).parts), kind, info.st_size))
    selection = _select(src, entries, sub, modules)
    dst.mkdir(parents=True, exist_ok=True)
    for entry in selection.kept:
        target = dst.joinpath(*entry.path.parts)
        if entry.kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src.joinpath(*entry.path.parts), target)


def _extract_zip(src: Path, dst: Path, sub: Submission, modules: set[tuple[str, str]]) -> None:
    if not zipfile.is_zipfile(src):
        raise SubmissionError(f"{src.name} is not a valid zip file")
    try:
        with zipfile.ZipFile(src) as zf:
            infos = zf.infolist()
            unpacked = sum(i.file_size for i in infos)
            if unpacked > MAX_BYTES and unpacked > BOMB_RATIO * src.stat().st_size:
                raise SubmissionError(f"{src.name}: a zip bomb (it would unpack to {skipping.human(unpacked)}, more "
                                      f"than {BOMB_RATIO} times its size): not unpacked")
            entries = []
            for info in infos:
                name = PurePosixPath(info.filename)
                if name.is_absolute() or ".." in name.parts:
                    sub.problems.append(f"{info.filename}: path outside the archive (skipped)")
                    continue
                kind = ("link" if stat.S_ISLNK(info.external_attr >> 16) else "dir" if info.is_dir() else "file")
                entries.append(Entry(name, kind, info.file_size, info))
            selection = _select(src, entries, sub, modules)
            dst.mkdir(parents=True, exist_ok=True)
            for entry in selection.kept:  # what was left out is never unpacked: it costs no disk
                target = dst.joinpath(*entry.path.parts)
                if entry.kind == "dir":
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(entry.ref) as fin, open(target, "wb") as fout:
                    shutil.copyfileobj(fin, fout)  # zipfile stops at the declared size, which the limits bound
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise SubmissionError(f"{src.name} could not be unpacked: {exc}") from None


def _select(src: Path, entries: list[Entry], sub: Submission, modules: set[tuple[str, str]]) -> skipping.Selection:
    """What of ``entries`` is graded; links and what was left out are noted, too much kept refuses it whole."""
    selection = skipping.select(entries, modules)
    sub.problems.extend(f"{link.path}: symbolic links are not graded (skipped)" for link in selection.links)
    if note := skipping.note(selection.skipped):
        sub.problems.append(note)
    if reason := skipping.over_limits(selection.kept):
        raise SubmissionError(f"{src.name}: {reason}")
    return selection


def notebook_modules(cells: Iterable[Mapping[str, Any]], exercises: tuple[Exercise, ...]
                     ) -> tuple[dict[str, str], list[str]]:
    """``{exercise: module source}`` from the marked code cells, and problems found on the way."""
    known = {e.name for e in exercises}
    sources: dict[str, list[str]] = {}
    problems = []
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        lines = source.splitlines()
        first = next((line for line in lines if line.strip()), "")
        match = MARKER.match(first)
        if not match:
            continue
        name = match.group(1)
        if name not in known:
            problems.append(f"cell {index + 1} is marked for an unknown exercise {name!r} "
                            f"(known: {', '.join(sorted(known))})")
            continue
        body = ["# [ipython magic, not graded] " + line if line.lstrip().startswith(("%", "!")) else line
                for line in lines]
        sources.setdefault(name, []).append(f"{loader.cell_marker(index + 1)}\n" + "\n".join(body) + "\n")
    return {name: "\n".join(parts) for name, parts in sources.items()}, problems


def _from_notebook(path: Path, impl: Path, exercises: tuple[Exercise, ...], sub: Submission) -> Path:
    try:  # in a child process, within a memory and a time bound (notebook_reader)
        nb = notebook_reader.read(path)
    except notebook_reader.NotebookError as exc:
        raise SubmissionError(str(exc)) from None
    meta = nb["grader"]
    if meta.get("student_id"):
        sub.student = sanitize(str(meta["student_id"]))
    sub.display_name = display_name(meta.get("display_name"))
    modules, problems = notebook_modules(nb["cells"], exercises)
    sub.problems.extend(f"notebook {path.name}: {p}" for p in problems)
    if not modules:
        sub.problems.append(f"notebook {path.name} has no code cell starting with '# %% exercise: <name>' "
                            "(see grader/grading/README.md)")
    impl.mkdir(parents=True, exist_ok=True)
    by_name = {e.name: e for e in exercises}
    for name, source in modules.items():
        exercise = by_name[name]
        (impl / name).mkdir(parents=True, exist_ok=True)
        (impl / name / f"{exercise.module}.py").write_text(source, encoding="utf-8")
    return impl
