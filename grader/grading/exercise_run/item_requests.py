"""The requests a worker is sent for an exercise's planned items: one per item (its inputs drawn, or loaded from the
batch's store), and the compile-ahead requests that go before them; and an item in the words of a report.
"""

from __future__ import annotations

from collections.abc import Mapping

from grader.checks import tensors
from grader.checks.spec import Exercise, Inputs
from grader.grading.exercise_run.case_references import CaseReferences
from grader.grading.exercise_run.item_plan import Item
from grader.grading.isolation import protocol


def describe(item: Item | None, exercise: Exercise) -> str:
    """What a worker was doing, in a report's words: importing the module, or running ``item``."""
    if item is None:
        return f"importing {exercise.module}.py"
    what = {"example": "example case", "random": "random case", "integrity": "integrity case",
            "fresh": "fresh-input case", "bad_input": "bad-input check", "speed": "speed measurement"}
    text = f"running the {item.part.name} {what.get(item.role, item.role + ' check')}"
    return text + (f" {item.case.label}" if item.case is not None else "")


def request_for(item: Item, references: CaseReferences | None) -> protocol.Request:
    """The request that has a worker run ``item``: its inputs from the batch's store, else drawn here."""
    def inputs(case):
        return item.part.make_inputs(case) if references is None else references.inputs(item.part, case)

    if item.role == "bad_input":
        return protocol.RunBadInput(item.id, item.part.name, int(item.index or 0))
    if item.role == "speed":
        recheck = inputs(item.recheck) if item.recheck is not None else None
        return protocol.RunSpeed(item.id, item.part.name, item.budget_s, recheck)
    if item.case is None:
        return protocol.RunExtra(item.id, item.part.name, item.role)
    return protocol.RunCase(item.id, item.part.name, inputs(item.case), item.full)


def ahead_requests(items: list[Item], load_errors: Mapping[str, str]) -> list[protocol.CompileAhead]:
    """What a worker compiles ahead before ``items``, as requests: per part, its cases' inputs on the meta device
    (no values), one per distinct signature; then, per part with a speed item, its benchmarks' (compiled as the
    speed measurement compiles). Nothing for a part whose module did not load."""
    cases: dict[str, dict[tuple, Inputs]] = {}
    benchmarks: dict[str, list[Inputs]] = {}
    for item in items:
        part = item.part
        speed = item.role == "speed"
        if (part.name in load_errors or item.role == "bad_input" or (item.case is None and not speed)
                or (speed and part.name in benchmarks)):
            continue
        try:
            with tensors.generated_on("meta"):
                if speed:
                    benchmarks[part.name] = [part.make_inputs(bench.case) for bench in part.benchmarks]
                else:
                    inputs = part.make_inputs(item.case)
                    cases.setdefault(part.name, {}).setdefault(signature(inputs), inputs)
        except Exception:  # inputs whose building reads values: these calls compile when they run
            continue
    return ([protocol.CompileAhead(f"compile-ahead-{part}", part, list(signatures.values()))
             for part, signatures in cases.items()]
            + [protocol.CompileAhead(f"compile-ahead-speed-{part}", part, signatures, benchmarks=True)
               for part, signatures in benchmarks.items() if signatures])


def signature(inputs: Inputs) -> tuple:
    return tuple((name, (tuple(v.shape), v.stride(), str(v.dtype)) if hasattr(v, "stride") else repr(v))
                 for name, v in sorted(inputs.items()))
