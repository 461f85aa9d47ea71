"""Every known-wrong fixture fails the check it declares, with a message naming what is wrong, and passes
the checks it declares it passes (it fails on the right test). Together the fixtures show every kind of
check of every part failing (speed excepted: it needs a GPU, see tests/speed/test_gpu_speed.py). An edit fixture
that no longer applies to the current solution fails with the edit that broke."""

from __future__ import annotations

import re
from functools import cache

import pytest

from grader import exercises
from grader.checks import cases as cases_mod
from grader.checks import catalog, execute, loader, verdicts
from grader.checks.runtime import configure

from ..known_wrong import Edit, EditError, KnownWrong, apply_edits, discover, tree_or_fail

FIXTURES = discover()
N_RANDOM = 12  # random cases on top of the examples


@cache
def _verdicts(fixture: KnownWrong, part_name: str, what: str) -> dict[str, list[verdicts.Verdict]]:
    """The fixture's verdicts for one check, by catalog kind (``correctness`` gives examples and random). Cached: the
    tests below ask for the same checks, each run once."""
    if what == "correctness":
        examples = _verdicts(fixture, part_name, "examples")["examples"]
        if _load_error(fixture, part_name) is not None:  # the load itself is the check that fires
            return {what: examples}
        return {"examples": examples, "random": _verdicts(fixture, part_name, "random")["random"]}
    exercise = exercises.get(fixture.exercise)
    part = exercise.part(part_name)
    device = configure().device
    try:
        module = loader.load(tree_or_fail(fixture), exercise, part.functions)
    except loader.LoadError as exc:  # the load itself is the check that fires
        return {what: [verdicts.Verdict(False, str(exc))]}
    student_dir = str(loader.module_path(fixture.root, exercise).parent)
    found: dict[str, list[verdicts.Verdict]] = {}
    if what == "examples":
        found["examples"] = [verdicts.run_case(part, module, case, device)
                             for case in part.examples if part.skip(case, device) is None]
    if what == "random":
        found["random"] = [verdicts.run_case(part, module, case, device)
                           for case in cases_mod.draw(part, device, N_RANDOM, seed=0)]
    if what == "integrity":
        found[what] = [verdicts.run_integrity(part, module, case, device, student_dir=student_dir)
                       for case in part.integrity_examples if part.skip(case, device) is None]
    if what == "bad_input":
        found[what] = [verdicts.run_bad_input(module, bad, device) for bad in part.bad_inputs]
    extra = next((x for x in part.extra_checks if x.name == what), None)
    if extra is not None:
        found[what] = [extra.judge(extra.execute(module, device), device)]
    if not found:
        raise ValueError(f"{fixture.id}: unknown check {what!r}")
    return found


@cache
def _load_error(fixture: KnownWrong, part_name: str) -> str | None:
    exercise = exercises.get(fixture.exercise)
    try:
        loader.load(tree_or_fail(fixture), exercise, exercise.part(part_name).functions)
    except loader.LoadError as exc:
        return str(exc)
    return None


def _all(found: dict[str, list[verdicts.Verdict]]) -> list[verdicts.Verdict]:
    return [v for verdict_list in found.values() for v in verdict_list]


EDITED = [f for f in FIXTURES if f.edits]


def test_every_exercise_has_fixtures():
    names = {f.exercise for f in FIXTURES}
    assert {e.name for e in exercises.all_exercises()} <= names


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.id for f in FIXTURES])
def test_known_wrong_fails_where_it_should(fixture: KnownWrong):
    assert fixture.expectations, f"{fixture.id} declares no 'expect:' line"
    assert any(e.kind == "expect" for e in fixture.expectations)
    for e in fixture.expectations:
        found = _all(_verdicts(fixture, e.part, e.check))
        failures = [v.message for v in found if not v.passed]
        if e.kind == "expect":
            assert failures, f"{fixture.id}: {e.part}.{e.check} passed, but the fixture is wrong ({fixture.summary})"
            assert any(re.search(e.pattern, m, re.IGNORECASE | re.DOTALL) for m in failures), (
                f"{fixture.id}: {e.part}.{e.check} failed, but no message matches {e.pattern!r}:\n\n"
                + "\n---\n".join(failures[:3])
            )
        else:
            assert found, f"{fixture.id}: {e.part}.{e.check} ran no case"
            assert not failures, f"{fixture.id}: {e.part}.{e.check} should pass:\n" + "\n---\n".join(failures[:3])


@pytest.mark.parametrize("exercise", exercises.all_exercises(), ids=lambda e: e.name)
def test_every_check_is_shown_to_fail_on_a_known_wrong_fixture(exercise):
    """Each kind of check of each part fails on at least one fixture: no check that cannot fail."""
    failing: set[tuple[str, str]] = set()
    for fixture in (f for f in FIXTURES if f.exercise == exercise.name):
        for e in fixture.expectations:
            if e.kind != "expect":
                continue
            for kind, found in _verdicts(fixture, e.part, e.check).items():
                if any(not v.passed for v in found):
                    failing.add((e.part, kind))
    wanted = {(p.name, kind) for p in exercise.parts for kind in catalog.kinds(p) if kind != catalog.SPEED}
    missing = sorted(wanted - failing)
    assert not missing, f"{exercise.name}: no known-wrong fixture shows these checks failing: " + ", ".join(
        f"{p}.{k}" for p, k in missing)


@pytest.mark.parametrize("fixture", EDITED, ids=[f.id for f in EDITED])
def test_every_edit_applies_to_the_current_solution(fixture: KnownWrong):
    root = tree_or_fail(fixture)
    assert loader.module_path(root, exercises.get(fixture.exercise)).is_file()


def test_an_edit_that_no_longer_applies_says_which_and_why():
    source = "a = 1\nb = 2\nb = 2\n"
    assert apply_edits(source, (Edit("a = 1", "a = 3"),), where="f.toml", base="s.py") == "a = 3\nb = 2\nb = 2\n"
    with pytest.raises(EditError, match=r"f\.toml: edit 2 no longer applies to s\.py: its old text occurs 0 times"):
        apply_edits(source, (Edit("a = 1", "a = 3"), Edit("c = 1", "")), where="f.toml", base="s.py")
    with pytest.raises(EditError, match="occurs 2 times there"):
        apply_edits(source, (Edit("b = 2", ""),), where="f.toml", base="s.py")


def test_a_fixture_tree_never_imports_the_grader_helpers():
    """Fixtures are student code: they must stand on their own (execute is the grader's, not theirs)."""
    assert execute.__name__ == "grader.checks.execute"
    for fixture in FIXTURES:
        text = (loader.module_path(fixture.root, exercises.get(fixture.exercise))).read_text()
        assert "from grader" not in text and "import grader" not in text, fixture.id


def test_fixtures_are_written_as_submission_folders(tmp_path):
    """``python -m tests.known_wrong DEST`` (course staff grade the fixtures with ``grader grade DEST/*``)."""
    from .. import known_wrong

    folders = known_wrong.write_submissions(tmp_path)
    assert len(folders) == len(discover()) + len(known_wrong.slowed()) + len(known_wrong.cheats())
    for folder in folders:
        modules = [p for p in folder.rglob("*.py")]
        assert len(modules) == 1, folder
        exercise = exercises.get(modules[0].parent.name)
        assert loader.module_path(folder, exercise) == modules[0]
        assert len(folder.name) <= 64 and "." not in folder.name  # a valid student id


def _hinted_parts(fixture: KnownWrong) -> list[str]:
    return sorted({e.part for e in fixture.expectations if e.kind == "expect" and e.check in ("correctness",
                                                                                               "examples", "random")})


HINTED = [(f, p) for f in FIXTURES for p in _hinted_parts(f)]


@pytest.mark.parametrize(("fixture", "part_name"), HINTED, ids=[f"{f.id}.{p}" for f, p in HINTED])
def test_a_part_gets_the_hint_its_errors_support_and_no_other(fixture: KnownWrong, part_name: str):
    """The hint a report leads with (the kind a third of the failing checks give, or the layout of the failing
    cases) is the one the fixture declares (``hint: part: kind``), and none where it declares none: a hint that
    speaks where the errors do not support it sends a student after the wrong bug."""
    from grader.checks.compare import hint_kind, inputs_contiguous
    from grader.grading.results.results import FAILED, GRADED, PASSED, CheckResult, PartResult

    part = exercises.get(fixture.exercise).part(part_name)
    device = configure().device
    found = _verdicts(fixture, part_name, "correctness")  # the same cases the test above ran, run once
    if _load_error(fixture, part_name) is not None:
        pytest.skip("the module does not load: no case runs, no hint")
    cases = [c for c in part.examples if part.skip(c, device) is None] + cases_mod.draw(part, device, N_RANDOM, seed=0)
    checks = []
    for i, (case, verdict) in enumerate(zip(cases, found["examples"] + found["random"], strict=True)):
        inputs = part.make_inputs(case)
        size = sum(v.numel() for v in inputs.values() if hasattr(v, "numel"))
        status = PASSED if verdict.passed else FAILED
        checks.append(CheckResult(f"{part_name}.random[{i}]", "random", case.label, status, verdict.message, None,
                                  size, inputs_contiguous(inputs)))
    result = PartResult(part_name, GRADED, checks=checks)
    common = result.common_hint()
    shown = {hint_kind(common[0])} if common else set()
    if result.layout_hint():
        shown.add("layout")
    declared = fixture.hints.get(part_name)
    assert shown == ({declared} if declared else set()), (
        f"{fixture.id}: {part_name} is told {sorted(shown) or 'no hint'}, declared {declared or 'none'}"
        + (f"\nhint: {common[0]} ({common[1]} of {common[2]} failing checks)" if common else ""))
