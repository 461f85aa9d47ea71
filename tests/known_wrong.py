"""Fixture implementations: known-wrong ones (``tests/fixtures``), slowed but correct ones
(``tests/slow_fixtures``) and forgeries of the speed measurement (``tests/cheating``), and what each must show.

A fixture is either

* an **edit** of the reference solution, ``<folder>/<exercise>/<name>.toml``: the solution plus a few
  exact source replacements (``[[edit]]`` tables with ``old`` and ``new``; each ``old`` must occur
  exactly once in the current solution), applied at test time into a temporary tree; or
* a **file** tree ``<folder>/<exercise>/<name>/<exercise>/<module>.py`` laid out like ``assignments/``:
  cheats that are not a small change of a solution.

Its description (an edit's ``doc``, a file's module docstring) declares, one per line:

    expect: <part>.<check>: <regex>   this check must fail with a message matching regex
    passes: <part>.<check>            this check must pass (so the fixture fails on the right test)
    hint: <part>: <kind>              the hint its part's failing checks point to (formula, boundary, layout);
                                      a part whose correctness fails and declares none must get no hint
    slower: <part>                    (slowed fixtures) the part whose speed credit it must lose

where <check> is a kind of check from :mod:`grader.checks.catalog` — ``examples``, ``random``,
``integrity``, ``bad_input`` or an extra check's name (e.g. ``memory``) — or ``correctness``, which is
the examples and the random cases together.
"""

from __future__ import annotations

import ast
import atexit
import re
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from grader import exercises
from grader.checks import loader

TESTS = Path(__file__).parent
FIXTURES = TESTS / "fixtures"
SLOW_FIXTURES = TESTS / "slow_fixtures"
SOLUTIONS = TESTS.parent / "solutions"
_LINE = re.compile(r"^(expect|passes):\s*(\w+)\.(\w+)(?::\s*(.+))?$")


class EditError(Exception):
    """An edit fixture no longer applies to the current solution (told verbatim in the failing test)."""


@dataclass(frozen=True)
class Edit:
    old: str
    new: str


@dataclass(frozen=True)
class Expectation:
    kind: str  # "expect" or "passes"
    part: str
    check: str
    pattern: str


@dataclass(frozen=True)
class Fixture:
    exercise: str
    name: str
    source: Path  # the .toml of an edit, or the tree of a file fixture
    doc: str
    edits: tuple[Edit, ...] = ()  # empty: a file fixture

    @property
    def id(self) -> str:
        return f"{self.exercise}/{self.name}"

    @property
    def summary(self) -> str:
        return self.doc.splitlines()[0] if self.doc else ""

    @property
    def expectations(self) -> tuple[Expectation, ...]:
        found = []
        for line in self.doc.splitlines():
            m = _LINE.match(line.strip())
            if m:
                found.append(Expectation(m[1], m[2], m[3], (m[4] or "").strip()))
        return tuple(found)

    @property
    def hints(self) -> dict[str, str]:
        """part -> the kind of hint its failing correctness checks must point to."""
        found = {}
        for line in self.doc.splitlines():
            if line.startswith("hint:"):
                part, kind = (x.strip() for x in line.split(":", 1)[1].split(":", 1))
                found[part] = kind
        return found

    @property
    def slower(self) -> tuple[str, ...]:
        return tuple(line.split(":", 1)[1].strip() for line in self.doc.splitlines() if line.startswith("slower:"))

    @property
    def root(self) -> Path:
        """The implementation tree (an edit is applied on first use; :class:`EditError` if it does not apply)."""
        return tree(self)


KnownWrong = Fixture  # the name the known-wrong tests use


def apply_edits(source: str, edits: tuple[Edit, ...], *, where: str, base: str) -> str:
    """``source`` with every edit applied in order; each ``old`` must occur exactly once."""
    for number, edit in enumerate(edits, 1):
        count = source.count(edit.old)
        if count != 1:
            raise EditError(
                f"{where}: edit {number} no longer applies to {base}: its old text occurs {count} times there "
                f"(it must occur exactly once). Update the edit to the current solution. Old text:\n{edit.old}"
            )
        source = source.replace(edit.old, edit.new)
    return source


def _read_edit(path: Path, exercise: str) -> Fixture:
    data = tomllib.loads(path.read_text())
    unknown = set(data) - {"doc", "edit"}
    if unknown or not isinstance(data.get("doc"), str) or not data.get("edit"):
        raise ValueError(f"{path}: an edit fixture has a 'doc' string and [[edit]] tables (and nothing else: "
                         f"{', '.join(sorted(unknown)) or 'no edit'})")
    edits = []
    for entry in data["edit"]:
        if set(entry) != {"old", "new"} or not all(isinstance(v, str) for v in entry.values()) or not entry["old"]:
            raise ValueError(f"{path}: every [[edit]] has exactly an 'old' (non-empty) and a 'new' string")
        edits.append(Edit(entry["old"], entry["new"]))
    return Fixture(exercise, path.stem, path, data["doc"].strip(), tuple(edits))


def _read_file(module: Path) -> Fixture:
    exercise, name = module.parts[-4], module.parts[-3]
    doc = ast.get_docstring(ast.parse(module.read_text())) or ""
    return Fixture(exercise, name, module.parent.parent, doc)


def discover(folder: Path = FIXTURES) -> list[Fixture]:
    """Every fixture under ``folder``, edits and files, sorted by id."""
    names = {e.name for e in exercises.all_exercises()}
    found = [_read_edit(path, path.parent.name) for path in folder.glob("*/*.toml") if path.parent.name in names]
    found += [_read_file(module) for module in folder.glob("*/*/*/*.py") if module.parts[-4] in names]
    return sorted(found, key=lambda f: f.id)


def slowed() -> list[Fixture]:
    return discover(SLOW_FIXTURES)


def solution_path(exercise_name: str) -> Path:
    return loader.module_path(SOLUTIONS, exercises.get(exercise_name))


def materialize(fixture: Fixture, dest: Path) -> Path:
    """Write the fixture's tree into ``dest`` (``dest/<exercise>/<module>.py``) and return ``dest``."""
    exercise = exercises.get(fixture.exercise)
    base = solution_path(fixture.exercise)
    where = fixture.source.relative_to(TESTS.parent).as_posix()
    text = apply_edits(base.read_text(), fixture.edits, where=where, base=base.relative_to(TESTS.parent).as_posix())
    module = loader.module_path(dest, exercise)
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(f"# {fixture.id}: {base.relative_to(TESTS.parent).as_posix()} with the edits of {where}\n"
                      + text)
    return dest


def tree_or_fail(fixture: Fixture) -> Path:
    """The fixture's tree, or a test failure saying which edit no longer applies (no chained traceback)."""
    try:
        return fixture.root
    except EditError as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)


_WORK: list[Path] = []


@cache
def tree(fixture: Fixture) -> Path:
    """The fixture's implementation tree: a file fixture's own, an edit's written once per process."""
    if not fixture.edits:
        return fixture.source
    if not _WORK:
        _WORK.append(Path(tempfile.mkdtemp(prefix="fixtures-")))
        atexit.register(shutil.rmtree, _WORK[0], True)
    return materialize(fixture, _WORK[0] / fixture.exercise / fixture.name)


CHEATING = TESTS / "cheating"  # forgeries of the speed measurement, laid out as tests/fixtures


def cheats() -> list[Fixture]:
    return discover(CHEATING)


def write_submissions(dest: Path, *, kinds: tuple[str, ...] = ("wrong", "slow", "cheating")) -> list[Path]:
    """Every fixture of ``kinds`` as a submission folder ``dest/<kind>-<exercise>-<name>`` for ``grader grade``
    (only its exercise is present; the others grade as not submitted)."""
    written = []
    for kind, fixtures in (("wrong", discover()), ("slow", slowed()), ("cheating", cheats())):
        if kind in kinds:
            for fixture in fixtures:
                folder = dest / f"{kind}-{fixture.exercise}-{fixture.name}"
                if fixture.edits:
                    materialize(fixture, folder)
                else:
                    shutil.copytree(fixture.source, folder, dirs_exist_ok=True)
                written.append(folder)
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.known_wrong",
                                     description="write the fixtures as submission folders, to grade them with "
                                                 "`grader grade DEST/*` (e.g. on a GPU)")
    parser.add_argument("dest", type=Path, help="folder to write (created)")
    parser.add_argument("--kinds", default="wrong,slow,cheating",
                        help="comma-separated: wrong (tests/fixtures), slow (tests/slow_fixtures), cheating "
                             "(tests/cheating); default: all")
    args = parser.parse_args(argv)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = set(kinds) - {"wrong", "slow", "cheating"}
    if unknown:
        parser.error(f"unknown kind(s): {', '.join(sorted(unknown))}")
    for folder in write_submissions(args.dest, kinds=kinds):
        print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
