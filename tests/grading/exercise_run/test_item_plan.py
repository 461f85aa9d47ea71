"""An exercise's plan (grader.grading.exercise_run.item_plan): speed is planned on a GPU only, and parts that share a
strategy share their random shapes, each with values of its own."""

from __future__ import annotations

from grader import exercises
from grader.grading.exercise_run import item_plan

GELU = exercises.get("gelu")


def test_speed_is_not_planned_on_cpu():
    assert not any(it.role == "speed" for it in item_plan.plan(GELU, device="cpu", secret="s", random_cases=0,
                                                          speed_budget_s=1.0))
    assert any(it.role == "speed" for it in item_plan.plan(GELU, device="cuda", secret="s", random_cases=0,
                                                      speed_budget_s=1.0))


def test_parts_that_share_a_strategy_share_their_random_shapes_with_values_of_their_own():
    """FlashAttention's three parts draw from one strategy: each is given the same random shapes, dtypes and options
    (a kernel the parts share is compiled once for them all), each with secret values of its own. RMSNorm's two
    parts have strategies of their own, and their own draws."""
    def random_cases(exercise, device):
        by_part: dict[str, list] = {}
        for it in item_plan.plan(exercise, device=device, secret="s", random_cases=12, speed_budget_s=1.0):
            if it.role == "random":
                by_part.setdefault(it.part.name, []).append(it.case)
        return by_part

    for device in ("cpu", "cuda"):
        fa = random_cases(exercises.get("flash_attention"), device)
        forward, backward, autograd = fa["forward"], fa["backward"], fa["autograd"]
        assert len(forward) == len(backward) == len(autograd) == 12
        assert [c.params for c in forward] == [c.params for c in backward] == [c.params for c in autograd]
        seeds = [{c.seed for c in cases} for cases in (forward, backward, autograd)]
        assert seeds[0].isdisjoint(seeds[1]) and seeds[0].isdisjoint(seeds[2]) and seeds[1].isdisjoint(seeds[2])
        assert len({(c["dtype"], c["d"], c["causal"]) for c in forward}) > 1  # the draw still varies the kernels

        rms = random_cases(exercises.get("rmsnorm"), device)
        assert [c.params for c in rms["forward"]] != [c.params for c in rms["backward"]]
