"""The grader's folders are layers: checks ← exercises ← speed ← (pytest_plugin, grading) ← cli. A module
imports from its own folder and from folders to its left, never to its right; pytest_plugin and grading
never import each other (what both need lives lower)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GRADER = Path(__file__).resolve().parents[1] / "grader"
LAYER = {"checks": 0, "exercises": 1, "speed": 2, "pytest_plugin": 3, "grading": 3, "cli": 4}


def _folder(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "grader" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYER else None


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


MODULES = sorted(p for p in GRADER.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(GRADER)))
def test_no_import_goes_to_the_right(path):
    rel = path.relative_to(GRADER)
    mine = "cli" if rel.name == "cli.py" and len(rel.parts) == 1 else rel.parts[0] if len(rel.parts) > 1 else None
    if mine not in LAYER:
        return  # grader/__init__.py
    for module in _imports(path):
        other = _folder(module)
        if other is None or other == mine:
            continue
        assert LAYER[other] < LAYER[mine], f"{rel} imports {module}: {other} is not to the left of {mine}"
