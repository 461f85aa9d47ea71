"""The reference solutions' kernels compile for every GPU a course may have (:mod:`grader.checks.cross_compile`): on
the CPU, for a named target, with the dtypes, constexprs and launch options the exercises' cases launch them with.
Running is not checked here (the ``gpu`` tests do that on the grading GPUs). ~1 minute on two cores."""

from __future__ import annotations

import pytest

from grader import exercises
from grader.checks import cross_compile, runtime
from grader.checks.cross_compile import TARGETS, Variant

pytestmark = pytest.mark.skipif(not runtime.configure().interpreter,
                                reason="learns the references' launches in the Triton interpreter: the CPU suite's")


@pytest.fixture(scope="module")
def variants() -> list[Variant]:
    return cross_compile.capture(exercises.all_exercises())


@pytest.fixture(scope="module")
def compiled(variants: list[Variant]) -> dict[str, list[cross_compile.Result]]:
    # every target at once, one process per core: the file takes the time of the slowest one
    return cross_compile.cross_compile_all(TARGETS, variants)


def test_capture_finds_every_exercises_kernels_in_every_dtype_its_cases_use(variants: list[Variant]) -> None:
    for exercise in exercises.all_exercises():
        found = [v for v in variants if v.exercise == exercise.name]
        assert found, f"{exercise.name}: the reference launched no kernel on its cases"
        launched = {d for v in found for d in v.dtypes.split("/")}
        cases = [c for p in exercise.parts for c in (*p.examples, *(b.case for b in p.benchmarks))]
        assert {c["dtype"] for c in cases if "dtype" in c.params} <= launched, exercise.name


@pytest.mark.parametrize("target", list(TARGETS))
def test_every_reference_kernel_compiles_for(target: str, variants: list[Variant],
                                             compiled: dict[str, list[cross_compile.Result]]) -> None:
    results = compiled[target]
    assert [r.variant for r in results] == variants
    failed = [f"{r.variant.label} (from {r.variant.source}):\n{r.error}" for r in results if not r.ok]
    assert not failed, f"{len(failed)} of {len(results)} variants do not compile for {target}:\n" + "\n".join(failed)
    limit = TARGETS[target].shared
    too_big = [f"{r.variant.label}: {r.shared} B" for r in results if r.shared > limit]
    assert not too_big, f"more shared memory than {target}'s {limit} B:\n" + "\n".join(too_big)
