"""The student-style corpus (``tests/corpus``): each submission's declared verdict, read from its module docstring,
and how the grader's stored results measure up to it. The declaration format is documented in
``tests/product/test_corpus.py``."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

from grader.checks.catalog import CheckId
from grader.grading.results import store
from grader.grading.results.results import (
    FAILED,
    GRADER_ERROR,
    NEEDS_REGRADE,
    PASSED,
    SKIPPED,
    CheckResult,
    ExerciseResult,
)

KEYS = ("status", "expect", "fails", "passes", "flags", "note", "all-checks-run")
_LINE = re.compile(r"^(?:(?P<device>cpu|gpu)-only:\s*)?(?P<key>[a-z-]+)(?::\s*(?P<rest>.*))?$")
_SELECTOR = re.compile(r"^(?P<part>\w+)\.(?P<kind>\w+)(?:\[(?P<where>[^\]]*)\])?$")
CORRECTNESS = ("examples", "random")  # the kind "correctness" stands for these


class DeclarationError(ValueError):
    """A corpus module's docstring declares something this format does not know."""


@dataclass(frozen=True)
class Selector:
    """``<part>.<kind>[<param>=<value>, ...]``: the checks of a part of one kind (``correctness`` = examples and
    random cases) whose case has every given parameter (written as in case labels: ``shape=2x8193``)."""

    part: str
    kind: str
    where: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Selector:
        m = _SELECTOR.match(text.strip())
        if not m:
            raise DeclarationError(f"not a check selector: {text!r}")
        where = []
        for item in filter(None, (s.strip() for s in (m["where"] or "").split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise DeclarationError(f"expected <param>=<value> in {text!r}")
            where.append((key.strip(), value.strip()))
        return cls(m["part"], m["kind"], tuple(where))

    def matches(self, check: CheckResult) -> bool:
        try:
            cid = CheckId.parse(check.id)
        except ValueError:
            return False
        kinds = CORRECTNESS if self.kind == "correctness" else (self.kind,)
        if cid.part != self.part or cid.kind not in kinds:
            return False
        params = (check.case or {}).get("params", {})
        return all(key in params and _short(params[key]) == value for key, value in self.where)

    def __str__(self) -> str:
        where = ",".join(f"{k}={v}" for k, v in self.where)
        return f"{self.part}.{self.kind}" + (f"[{where}]" if where else "")


def _short(value: object) -> str:
    """A case parameter as case labels write it."""
    if isinstance(value, tuple | list):
        return "x".join(str(v) for v in value) or "scalar"
    return str(value)


@dataclass(frozen=True)
class Declaration:
    key: str
    args: tuple[str, ...]
    device: str | None  # None: on every device
    line: str

    def applies(self, device: str) -> bool:
        return self.device in (None, device)


@dataclass(frozen=True)
class Submission:
    name: str  # the folder name, which is the student id
    exercise: str
    path: Path
    summary: str
    declarations: tuple[Declaration, ...]


def parse_line(line: str) -> Declaration | None:
    """One docstring line as a declaration; None for prose."""
    m = _LINE.match(line.strip())
    if not m or m["key"] not in KEYS or (m["key"] == "all-checks-run") != (m["rest"] is None):
        return None
    rest = m["rest"] or ""
    if m["key"] in ("status", "expect", "fails", "note"):
        head, sep, tail = rest.partition(":")
        if not sep:
            raise DeclarationError(f"{line.strip()!r}: expected '<what>: <value>'")
        args: tuple[str, ...] = (head.strip(), tail.strip())
    elif m["key"] == "flags":
        args = tuple(r.strip() for r in rest.split(",") if r.strip())
    else:
        args = (rest.strip(),) if rest.strip() else ()
    for i in ((0,) if m["key"] in ("expect", "fails", "passes", "note") else ()):
        Selector.parse(args[i])  # fail early on a bad selector
    if m["key"] == "note" and args[1] != "interpreter":
        raise DeclarationError(f"{line.strip()!r}: the only note is 'interpreter'")
    return Declaration(m["key"], args, m["device"], line.strip())


def load(path: Path) -> Submission:
    """``path``: ``tests/corpus/<name>/<exercise>/<exercise>.py``."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    found = tuple(d for line in doc.splitlines() if (d := parse_line(line)) is not None)
    return Submission(path.parents[1].name, path.parent.name, path.parents[1], doc.splitlines()[0] if doc else "",
                      found)


def corpus(root: Path) -> list[Submission]:
    return [load(p) for p in sorted(root.glob("*/*/*.py")) if p.stem == p.parent.name]


# ------------------------------------------------------------------------------------------------ judging


def has_interpreter_note(message: str) -> bool:
    """Whether a check's message says the failure may be a limit of the Triton interpreter: a line naming the
    interpreter together with a limit or the GPU (a traceback line naming the interpreter's module is no note)."""
    for line in message.splitlines():
        low = line.lower().strip()
        if low.startswith("file ") or "interpretererror" in low or "triton/runtime/interpreter" in low:
            continue
        if "interpreter" in low and ("limit" in low or "gpu" in low):
            return True
    return False


NOT_RUN = ("not run", "not implemented: ", "the module did not load")  # how a check that was never run is reported


def not_run(check: CheckResult) -> bool:
    """Whether the check was reported without being run (another check's fault stopped it)."""
    return check.status == FAILED and check.message.startswith(NOT_RUN)


def _checks(result: ExerciseResult) -> list[CheckResult]:
    return [c for p in result.parts for c in p.checks]


def _first_line(check: CheckResult) -> str:
    return f"{check.id}: {check.status}: {check.reason[:160]}"


def unmet(sub: Submission, result: ExerciseResult, device: str) -> list[str]:
    """The declarations of ``sub`` for ``device`` that ``result`` does not meet, each with what was found."""
    problems = []
    for d in (d for d in sub.declarations if d.applies(device)):
        check = _WHOLE.get(d.key, _selected)
        if (found := check(d, result)) is not None:
            problems.append(f"{d.line} — {found}")
    return problems


def _status(d, result: ExerciseResult) -> str | None:
    part = next((p for p in result.parts if p.name == d.args[0]), None)
    found = part.status if part else f"no part {d.args[0]!r}"
    if found == d.args[1]:
        return None
    return f"found {found!r}" + (f" ({part.message[:160]})" if part else "")


def _flags(d, result: ExerciseResult) -> str | None:
    raised = {f["rule"] for p in result.parts for f in p.flags}
    if d.args == ("none",):
        return f"raised {sorted(raised)}" if raised else None
    must = {r for r in d.args if not r.endswith("?")}
    may = must | {r.rstrip("?") for r in d.args}
    return None if must <= raised <= may else f"raised {sorted(raised) or 'none'}"


def _all_checks_run(d, result: ExerciseResult) -> str | None:
    bad = [c for c in _checks(result) if c.status == GRADER_ERROR or not_run(c)]
    bad_parts = [p for p in result.parts if p.status in (NEEDS_REGRADE, "error")]
    if not bad and not bad_parts:
        return None
    return "; ".join([*(_first_line(c) for c in bad[:3]), *(f"part {p.name}: {p.status}" for p in bad_parts)])


def _selected(d, result: ExerciseResult) -> str | None:
    """A declaration about the checks its selector picks (passes, expect, fails, note)."""
    selector = Selector.parse(d.args[0])
    chosen = [c for c in _checks(result) if selector.matches(c) and c.status != SKIPPED]
    if not chosen:
        return "no such check ran"
    failed = [c for c in chosen if c.status == FAILED]
    if d.key == "passes":
        wrong = [c for c in chosen if c.status != PASSED]
        return f"{len(wrong)} of {len(chosen)} did not pass, e.g. {_first_line(wrong[0])}" if wrong else None
    if d.key == "expect":
        if any(re.search(d.args[1], c.message) for c in failed):
            return None
        found = _first_line(failed[0]) if failed else f"all {len(chosen)} passed"
        return f"none failed with a matching message ({found})"
    if d.key == "fails":
        wrong = [c for c in chosen if c.status != FAILED or not re.search(d.args[1], c.message)]
        return f"{len(wrong)} of {len(chosen)} did not, e.g. {_first_line(wrong[0])}" if wrong else None
    if d.key == "note":
        bare = [c for c in failed if not has_interpreter_note(c.message)]
        if failed and not bare:
            return None
        found = _first_line(bare[0]) if bare else "none failed"
        return f"{len(bare)} of {len(failed)} failures carry no interpreter note ({found})"
    return None


_WHOLE = {"status": _status, "flags": _flags, "all-checks-run": _all_checks_run}  # the others select checks


def score(out: Path, student: str, exercise: str) -> tuple[float, float]:
    """(points, of how many) of one exercise, from the student's Gradescope results."""
    results = json.loads((store.student_dir(out, student) / "results.json").read_text())
    mine = [t for t in results["tests"] if t["name"].startswith(f"{exercise} / ") and "max_score" in t]
    return sum(t.get("score", 0.0) for t in mine), sum(t["max_score"] for t in mine)


def summary(result: ExerciseResult) -> str:
    """What the grader gave, in one line per part: status, checks passed / failed / not run / skipped, flags."""
    lines = []
    for p in result.parts:
        count = {s: sum(c.status == s for c in p.checks) for s in (PASSED, FAILED, SKIPPED)}
        missed = sum(not_run(c) for c in p.checks)
        flags = ", ".join(sorted({f["rule"] for f in p.flags})) or "none"
        lines.append(f"{p.name}: {p.status}; {count[PASSED]} passed, {count[FAILED] - missed} failed, "
                     f"{missed} not run, {count[SKIPPED]} skipped; flags: {flags}")
    return "\n".join(lines)
