"""Per-pytest-session state: the implementation tree under test, the device, which exercises were found
missing or unimplemented (reported once, then skipped), and hints drawn from all of a part's examples."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

from grader.checks import execute, loader, verdicts
from grader.checks.runtime import Mode
from grader.checks.spec import Exercise, Part


@dataclass
class _Status:
    module: ModuleType | None
    message: str = ""
    reported: bool = False


@dataclass
class GraderSession:
    mode: Mode
    impl_root: Path | None  # None: the tree the test file lives in
    curves: dict = field(default_factory=dict)  # the course's speed curves (--grader-course), by exercise[.part]
    _status: dict[tuple, _Status] = field(default_factory=dict)
    _hints: dict[tuple, str | None] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return self.mode.device

    def root_for(self, test_file: Path) -> Path:
        # assignments/<exercise>/test_<exercise>.py -> assignments/
        return self.impl_root if self.impl_root is not None else test_file.resolve().parent.parent

    def ready(self, exercise: Exercise, part: Part, test_file: Path) -> ModuleType:
        """The student's module for ``part``; fails the first test of an exercise (or part group) that
        is missing or not implemented with one short message, and skips the rest."""
        root = self.root_for(test_file)
        key = (str(root), exercise.name, part.missing_key)
        status = self._status.get(key)
        if status is None:
            status = self._status[key] = self._probe(root, exercise, part)
        if status.module is not None:
            return status.module
        if not status.reported:
            status.reported = True
            pytest.fail(status.message, pytrace=False)
        pytest.skip(f"{status.message.splitlines()[0]} (reported above)")

    def examples_hint(self, part: Part, module: ModuleType) -> str | None:
        """The layout hint from all of ``part``'s examples (run once per module, on the first failure)."""
        key = (id(module), part.name)
        if key not in self._hints:
            self._hints[key] = verdicts.examples_layout_hint(part, module, self.device)
        return self._hints[key]

    def _probe(self, root: Path, exercise: Exercise, part: Part) -> _Status:
        load_key = (str(root), exercise.name, "<load>")
        try:
            module = loader.load(root, exercise, part.functions)
        except loader.LoadError as exc:
            # one load failure per exercise: later parts reuse it (and skip)
            shared = self._status.setdefault(load_key, _Status(None, str(exc)))
            return shared
        # Not implemented only when no example gets past NotImplementedError (an untouched stub raises at once): an
        # option left unimplemented fails its own tests, and the others run.
        for probe in [c for c in part.examples if part.skip(c, self.device) is None] or list(part.examples[:1]):
            ex = execute.execute(part, module, part.make_inputs(probe), self.device)
            if ex.error_kind != "not_implemented":
                return _Status(module)
        names = " / ".join(part.functions)
        return _Status(None, f"{names} is not implemented yet — see {exercise.handout}")
