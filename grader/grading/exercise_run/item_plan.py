"""Plan one exercise: the items the worker is asked to run, from the checks the spec declares
(:mod:`grader.checks.catalog`), in that order.

* ``examples`` — each fixed example, with secret values (its seed mixes the run's secret with its index);
* ``random`` — ``random_cases`` cases drawn from the part's strategy with a secret seed; the parts of an exercise
  that share a strategy (FlashAttention's three) are given the same shapes, dtypes and options, each with values of
  its own: a kernel the student's parts share is then compiled once for them all (the parts' workers share the
  student's Triton cache), not once per part;
* ``integrity`` — the integrity cases, then the first of them again with fresh values (``fresh``: the same
  output bits for different inputs mean a cached or replayed result);
* ``bad_input`` — each call that must raise;
* each extra check;
* ``speed`` (CUDA only) — the part's benchmarks, then a call on a secretly seeded case of the first one.

The secret seed is the course's ``cases_seed`` (course.toml) where it sets one, so that every batch of the course
(a late submission, a regrade in a new folder, another section) grades every student on the same cases; else the
batch's secret. An example the device cannot run (the spec's ``skip``) is planned as skipped, with the reason, and
never sent. Seeds and secrets never leave the grader: the worker receives inputs, one item at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from grader.checks import cases as cases_mod
from grader.checks import catalog
from grader.checks.spec import Case, Exercise, Part
from grader.speed.measure import recheck_case

_DRAW_LOCK = threading.Lock()  # hypothesis is not thread-safe; exercises are planned from several threads


@dataclass(frozen=True)
class Item:
    id: str  # unique within the exercise: "<part>.<kind>[<label>]"
    part: Part
    kind: str  # the catalog kind: examples, random, integrity, bad_input, an extra check's name, speed
    role: str  # "example" | "random" | "integrity" | "fresh" | "bad_input" | the extra check's name | "speed"
    label: str
    case: Case | None = None
    index: int | None = None  # bad input
    full: bool = False  # integrity observations wanted
    skip_reason: str | None = None
    budget_s: float = 0.0  # speed
    recheck: Case | None = None  # speed: the fresh-input call after the timed runs


def _id(part: Part, kind: str, label: str = "") -> str:
    return str(catalog.CheckId(part.name, kind, label))


def plan_part(exercise: Exercise, part: Part, *, device: str, secret: str, random_cases: int,
              speed_budget_s: float, cases_seed: str = "") -> list[Item]:
    # Every case (shapes, dtypes, layouts, values) comes from the course's cases_seed where it sets one: every
    # batch of the course puts the same cases to every student, so a score depends on the code alone (a bug
    # that shows on 3 of 14 cases under one draw and 2 under another would not). Else from the batch's secret.
    def mix(*public) -> int:
        return cases_mod.mixed_seed(cases_seed or secret, exercise.name, part.name, *public)

    items: list[Item] = []
    for kind in catalog.kinds(part):
        if kind == "examples":
            for i, example in enumerate(part.examples):
                case = example.with_seed(mix("example", i))
                items.append(Item(_id(part, kind, example.label), part, kind, "example", example.label, case,
                                  full=True, skip_reason=part.skip(case, device)))
        elif kind == "random":
            items += _random_items(exercise, part, device=device, count=random_cases, seed=cases_seed or secret,
                                   mix=mix)
        elif kind == "integrity":
            items += _integrity_items(part, device=device, mix=mix)
        elif kind == "bad_input":
            for i, bad in enumerate(part.bad_inputs):
                items.append(Item(_id(part, kind, bad.label), part, kind, "bad_input", bad.label, index=i))
        elif kind == catalog.SPEED:
            if device == "cuda":
                items.append(Item(_id(part, kind), part, kind, "speed", "speed", budget_s=speed_budget_s,
                                  recheck=recheck_case(part, mix("speed"))))
        else:
            items.append(Item(_id(part, kind), part, kind, kind, kind))
    return items


def _random_items(exercise: Exercise, part: Part, *, device: str, count: int, seed: str,
                  mix: Callable[..., int]) -> list[Item]:
    if count <= 0:
        return []
    # Hypothesis generates the minimal example (smallest shape, seed 0) first whatever the seed: draw one more
    # and drop it, and give every case secret values.
    shapes_seed = cases_mod.mixed_seed(seed, exercise.name, _drawn_as(exercise, part), "random")
    with _DRAW_LOCK:
        drawn = cases_mod.draw(part, device, count + 1, shapes_seed)
    drawn = [c.with_seed(mix("random", i)) for i, c in enumerate(drawn[1:] or drawn)]
    return [Item(_id(part, "random", str(i)), part, "random", "random", case.label, case, full=True)
            for i, case in enumerate(drawn[:count])]


def _integrity_items(part: Part, *, device: str, mix: Callable[..., int]) -> list[Item]:
    """The integrity examples, then one fresh case drawn like the first that can run here."""
    items, runnable = [], []
    for i, example in enumerate(part.integrity_examples):
        case = example.with_seed(mix("integrity", i))
        reason = part.skip(case, device)
        items.append(Item(_id(part, "integrity", str(i)), part, "integrity", "integrity", example.label, case,
                          full=True, skip_reason=reason))
        if reason is None:
            runnable.append(case)
    if runnable:
        fresh = runnable[0].with_seed(mix("fresh"))
        items.append(Item(_id(part, "integrity", "fresh"), part, "integrity", "fresh", fresh.label, fresh))
    return items


def _drawn_as(exercise: Exercise, part: Part) -> str:
    """The part whose name seeds ``part``'s random draw: the exercise's first part with the same strategy."""
    return next(p.name for p in exercise.parts if p.cases is part.cases)


def plan(exercise: Exercise, *, device: str, secret: str, random_cases: int, speed_budget_s: float,
         parts: tuple[str, ...] | None = None, cases_seed: str = "") -> list[Item]:
    """Every item of the exercise (of ``parts`` only, for a regrade), in the catalog's order."""
    return [item for part in exercise.parts if parts is None or part.name in parts
            for item in plan_part(exercise, part, device=device, secret=secret, random_cases=random_cases,
                                  speed_budget_s=speed_budget_s, cases_seed=cases_seed)]
