"""The checks an exercise promises, named once: ``<part>.<kind>`` plus a label where a kind has several
(an example's case label, a bad input's label, a benchmark's label).

Kinds, in the order pytest lists them and the grader runs them:

* ``examples`` — the spec's fixed cases (one check each);
* ``random`` — cases drawn from the part's strategy (pytest: hypothesis; the grader: a secret draw);
* ``integrity`` — the integrity rules on the part's integrity cases (the grader adds a re-run with fresh
  values, which catches replayed results);
* ``bad_input`` — calls that must raise (one check each);
* an :class:`~grader.checks.spec.ExtraCheck`'s name (e.g. ``memory``);
* ``speed`` — the part's benchmarks (GPU only; one check each).

pytest generates one test function per kind (``test_<part>_<kind>``, parametrized by label) from this
list, and the grader plans its items from the same list; ``tests/checks/test_check_parity.py`` holds the two
against each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from grader.checks.spec import Exercise, Part

CASE_KINDS = ("examples", "random", "integrity", "bad_input")
SPEED = "speed"


@dataclass(frozen=True, order=True)
class CheckId:
    part: str
    kind: str
    label: str = ""

    def __str__(self) -> str:
        return f"{self.part}.{self.kind}" + (f"[{self.label}]" if self.label else "")

    @classmethod
    def parse(cls, text: str) -> CheckId:
        head, _, label = text.partition("[")
        part, _, kind = head.partition(".")
        if not part or not kind or (label and not label.endswith("]")):
            raise ValueError(f"not a check id: {text!r}")
        return cls(part, kind, label[:-1])


def kinds(part: Part) -> list[str]:
    """The kinds of check ``part`` has, in order."""
    found = ["examples", "random", "integrity"]
    if part.bad_inputs:
        found.append("bad_input")
    found += [x.name for x in part.extra_checks]
    if part.speed_graded:
        found.append(SPEED)
    return found


def labels(part: Part, kind: str) -> list[str]:
    """The labels of a kind's checks (``[""]`` for a kind that is one check)."""
    if kind == "examples":
        return [c.label for c in part.examples]
    if kind == "bad_input":
        return [b.label for b in part.bad_inputs]
    if kind == SPEED:
        return [b.label for b in part.benchmarks]
    return [""]


def part_checks(part: Part) -> list[CheckId]:
    return [CheckId(part.name, kind, label) for kind in kinds(part) for label in labels(part, kind)]


def exercise_checks(exercise: Exercise) -> list[CheckId]:
    return [check for part in exercise.parts for check in part_checks(part)]


def validate(exercise: Exercise) -> list[str]:
    """Problems that would make two checks share an id (pytest would silently rename one)."""
    problems = []
    seen: set[CheckId] = set()
    names = [p.name for p in exercise.parts]
    if len(set(names)) != len(names):
        problems.append(f"{exercise.name}: two parts share a name")
    for check in exercise_checks(exercise):
        if check in seen:
            problems.append(f"{exercise.name}: two checks are both {check}")
        seen.add(check)
    for part in exercise.parts:
        clash = {x.name for x in part.extra_checks} & {*CASE_KINDS, SPEED}
        if clash:
            problems.append(f"{exercise.name}.{part.name}: an extra check may not be called {', '.join(clash)}")
    return problems
