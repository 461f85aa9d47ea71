"""Known-wrong implementations kept as fixtures, and what each must trip.

Each fixture is an implementation tree ``tests/fixtures/<exercise>/<name>/<exercise>/<module>.py``
(laid out like ``assignments/``) whose module docstring declares, one per line:

    expect: <part>.<check>: <regex>   this check must fail with a message matching regex
    passes: <part>.<check>            this check must pass (so the fixture fails on the right test)

where <check> is a kind of check from :mod:`grader.checks.catalog` — ``examples``, ``random``,
``integrity``, ``bad_input`` or an extra check's name (e.g. ``memory``) — or ``correctness``, which is
the examples and the random cases together.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
_LINE = re.compile(r"^(expect|passes):\s*(\w+)\.(\w+)(?::\s*(.+))?$")


@dataclass(frozen=True)
class Expectation:
    kind: str  # "expect" or "passes"
    part: str
    check: str
    pattern: str


@dataclass(frozen=True)
class KnownWrong:
    exercise: str
    name: str
    root: Path  # the implementation tree
    summary: str
    expectations: tuple[Expectation, ...]

    @property
    def id(self) -> str:
        return f"{self.exercise}/{self.name}"


def discover() -> list[KnownWrong]:
    found = []
    for module in sorted(FIXTURES.glob("*/*/*/*.py")):
        exercise, name = module.parts[-4], module.parts[-3]
        doc = ast.get_docstring(ast.parse(module.read_text())) or ""
        expectations = []
        for line in doc.splitlines():
            m = _LINE.match(line.strip())
            if m:
                expectations.append(Expectation(m[1], m[2], m[3], (m[4] or "").strip()))
        found.append(KnownWrong(exercise, name, module.parent.parent, doc.splitlines()[0] if doc else "",
                                tuple(expectations)))
    return found
