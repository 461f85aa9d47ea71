"""How an exercise run groups its plan into workers (grader.grading.exercise_run.runner)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from grader import exercises
from grader.grading import config
from grader.grading.exercise_run import item_plan, runner


def test_on_a_gpu_each_part_and_with_room_its_speed_measurement_run_in_workers_of_their_own():
    """With ``parallel_parts`` (GPUs) each part is a group of its own, run side by side; with ``speed_apart`` too (a
    GPU with room for more runs than the batch has), a part's speed measurement is one more; without either (CPUs)
    one worker runs everything, in the plan's order."""
    fa = exercises.get("flash_attention")
    items = item_plan.plan(fa, device="cuda", secret="s", random_cases=2, speed_budget_s=1.0)
    settings = config.RunSettings(device="cuda", secret="s", random_cases=2, timeout_s=60.0, call_timeout_s=30.0,
                                  memory_mb=None, speed_budget_s=1.0, workdir=Path("."), parallel_parts=True)

    def shape(groups):
        assert sorted(it.id for group in groups for it in group) == sorted(it.id for it in items)  # each item once
        return [(group[0].part.name, {it.role == "speed" for it in group}) for group in groups]

    assert shape(runner._groups(items, settings)) == [("forward", {False, True}), ("backward", {False}),
                                                      ("autograd", {False, True})]
    apart = runner._groups(items, dataclasses.replace(settings, speed_apart=True))
    assert shape(apart) == [("forward", {False}), ("forward", {True}), ("backward", {False}), ("autograd", {False}),
                            ("autograd", {True})]
    assert runner._groups(items, dataclasses.replace(settings, parallel_parts=False)) == [items]
