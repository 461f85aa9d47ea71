"""The spec is the only source of checks: for every exercise, the checks a student's ``pytest`` collects
are exactly the checks the grader plans (so every check the tests promise is graded, and nothing is
graded that the tests do not show)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader import exercises
from grader.checks import catalog
from grader.grading.exercise_run import item_plan

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ("case", "bad", "bench")  # the parametrized arguments of the generated tests: their labels


def _collected(pytester: pytest.Pytester, exercise) -> set[catalog.CheckId]:
    items, _ = pytester.inline_genitems(str(ROOT / "assignments" / exercise.name), "--impl", str(ROOT / "solutions"),
                                        "-p", "no:cacheprovider")
    found = set()
    for item in items:
        marker = item.get_closest_marker("grader_check")
        assert marker is not None, f"{item.nodeid} runs no check of the spec"
        part, kind = marker.args[0].split(".", 1)
        params = getattr(getattr(item, "callspec", None), "params", {})
        label = next((params[p].label for p in PARAMS if p in params), "")
        found.add(catalog.CheckId(part, kind, label))
    return found


def _planned(exercise, device: str) -> set[catalog.CheckId]:
    items = item_plan.plan(exercise, device=device, secret="parity", random_cases=3, speed_budget_s=1.0)
    found = set()
    for item in items:
        if item.kind == catalog.SPEED:  # one item times every benchmark of the part
            found |= {catalog.CheckId(item.part.name, item.kind, b.label) for b in item.part.benchmarks}
        elif item.kind in ("examples", "bad_input"):
            found.add(catalog.CheckId(item.part.name, item.kind, item.label))
        else:
            found.add(catalog.CheckId(item.part.name, item.kind))
    return found


@pytest.mark.parametrize("exercise", exercises.all_exercises(), ids=lambda e: e.name)
def test_pytest_collects_what_the_grader_plans(pytester: pytest.Pytester, exercise):
    collected = _collected(pytester, exercise)
    on_gpu = _planned(exercise, "cuda")
    assert collected == on_gpu, (f"only pytest: {sorted(map(str, collected - on_gpu))}; "
                                 f"only the grader: {sorted(map(str, on_gpu - collected))}")
    # On a CPU the grader plans the same checks, less the speed benchmarks (no GPU to time them on).
    on_cpu = _planned(exercise, "cpu")
    assert on_cpu == {c for c in collected if c.kind != catalog.SPEED}


def test_flash_attention_memory_check_is_planned_with_points():
    forward = exercises.get("flash_attention").part("forward")
    (memory,) = forward.extra_checks
    assert memory.name == "memory" and memory.points > 0
    items = item_plan.plan(forward.exercise, device="cpu", secret="s", random_cases=0, speed_budget_s=1.0)
    assert [it.id for it in items if it.role == "memory"] == ["forward.memory"]


def test_integrity_cases_default_to_the_first_example():
    for exercise in exercises.all_exercises():
        for part in exercise.parts:
            assert part.integrity_examples == (part.integrity_cases or part.examples[:1])
            assert part.integrity_examples, f"{exercise.name}.{part.name} has no integrity case"
