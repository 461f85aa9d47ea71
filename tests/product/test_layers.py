"""The grader's folders are layers: checks ← exercises ← speed ← (pytest_plugin, grading) ← serve ← cli, and
handin (grader submit, grader results) beside them all, importing none. A module imports from its own folder and
from folders to its left, never to its right; pytest_plugin and grading never import each other (what both need
lives lower); serve, the grading server, builds on grading. Only grading and serve are staff-side, and the student
release leaves those two folders out whole (test_the_staff_side_is_two_folders). Inside grading
the wings are layers too: isolation ← config ← results ← exercise_run ← batch ← commands (config is a module; its
type-only imports of higher wings do not count)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GRADER = Path(__file__).resolve().parents[2] / "grader"
LAYER = {"handin": -1, "checks": 0, "exercises": 1, "speed": 2, "pytest_plugin": 3, "grading": 3, "serve": 4,
         "cli": 5}
WING = {"isolation": 0, "config": 1, "results": 2, "exercise_run": 3, "batch": 4, "commands": 5}


def _folder(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "grader" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYER else None


def _wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["grader", "grading"] and parts[2] in WING else None


def _type_only(tree: ast.Module) -> set[ast.AST]:
    """Imports under ``if TYPE_CHECKING:``: annotations, never run."""
    return {n for node in ast.walk(tree) if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
            for n in ast.walk(node)}


def _imports(path: Path) -> list[str]:
    found = []
    tree = ast.parse(path.read_text())
    skip = _type_only(tree)
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


MODULES = sorted(p for p in GRADER.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(GRADER)))
def test_no_import_goes_to_the_right(path):
    rel = path.relative_to(GRADER)
    mine = rel.stem if len(rel.parts) == 1 else rel.parts[0]
    if mine not in LAYER:
        return  # grader/__init__.py
    for module in _imports(path):
        other = _folder(module)
        if other is None or other == mine:
            continue
        assert LAYER[other] < LAYER[mine], f"{rel} imports {module}: {other} is not to the left of {mine}"


GRADING = sorted(p for p in (GRADER / "grading").rglob("*.py"))


@pytest.mark.parametrize("path", GRADING, ids=lambda p: str(p.relative_to(GRADER)))
def test_no_import_goes_to_a_later_wing_of_grading(path):
    rel = path.relative_to(GRADER / "grading")
    mine = rel.stem if len(rel.parts) == 1 else rel.parts[0]
    if mine not in WING:
        return  # grader/grading/__init__.py
    for module in _imports(path):
        other = _wing(module)
        if other is None or other == mine:
            continue
        assert WING[other] < WING[mine], f"grading/{rel} imports {module}: {other} is not before {mine}"


def test_every_module_of_grading_is_in_a_wing():
    loose = [p.name for p in (GRADER / "grading").glob("*.py") if p.stem not in WING and p.name != "__init__.py"]
    assert not loose, f"modules of grader/grading outside its wings: {loose}"


def test_the_staff_side_is_two_folders():
    """What students get is grader/ minus two folders, copied whole: no staff module lives outside them, and no
    student-side module imports one (its import would fail in the release)."""
    from grader.grading.commands import release

    assert release.STAFF_SIDE == ("grader/grading", "grader/serve")
    staff = {"grading", "serve"}
    for path in MODULES:
        rel = path.relative_to(GRADER)
        mine = rel.stem if len(rel.parts) == 1 else rel.parts[0]
        if mine in staff or mine == "cli":  # cli.py names the staff commands by module, and says when one is absent
            continue
        for module in _imports(path):
            assert _folder(module) not in staff, f"{rel} (shipped to students) imports {module}"


def _module_path(module: str) -> Path | None:
    base = GRADER.parent.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _reach(start: str) -> set[str]:
    """The grader modules ``start`` can import, at its top or inside a function, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        path = _module_path(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        todo += [m for m in _imports(path) if m.startswith("grader.")]
    return seen


def _within(reached: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in reached if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_the_trusted_timer_never_reaches_code_that_runs_a_students_call():
    """The trusted timer (python -m grader.speed.timer) replays recorded kernels: it imports nothing that imports a
    student's module or runs its Python, and none of the grader's judging or output."""
    reached = _reach("grader.speed.timer")
    assert "grader.speed.replay" in reached and "grader.speed.trusted" in reached  # what it does reach
    assert _within(reached, ("grader.checks.execute", "grader.checks.loader", "grader.checks.integrity",
                             "grader.speed.student_calls", "grader.speed.in_process", "grader.speed.recorder",
                             "grader.speed.credit", "grader.grading", "grader.serve")) == []


def test_the_sandboxed_worker_never_reaches_the_verdicts_the_timer_or_the_output():
    """The sandboxed worker (grader/grading/isolation/worker.py) runs the student's calls and records them: it
    imports none of what judges them (verdicts, credit), times them (the trusted timer) or writes results."""
    reached = _reach("grader.grading.isolation.worker")
    assert "grader.checks.execute" in reached and "grader.speed.student_calls" in reached
    assert _within(reached, ("grader.checks.verdicts", "grader.checks.compare", "grader.speed.credit",
                             "grader.speed.trust_checks", "grader.speed.thresholds", "grader.speed.timer",
                             "grader.speed.trusted", "grader.speed.replay", "grader.grading.config",
                             "grader.grading.results", "grader.grading.exercise_run", "grader.grading.batch",
                             "grader.grading.commands", "grader.serve")) == []
