"""A crash is charged to the check that caused it, never to the ones after it. A FlashAttention whose public
forward breaks its process (tests/crash/breaks_forward.py) loses the forward part's checks only; its backward
and autograd parts, whose code is the reference's, score as the reference's do in the same batch. On a CPU the
forward segfaults on every call; on a GPU it makes an illegal memory access at benchmark size, during the speed
measurement, which leaves the worker's CUDA context broken for every later call of that process."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grader.grading import config
from grader.grading.commands import grade as grade_cmd
from grader.grading.config import RunSettings

from ...crash import breaks_forward
from ...sandboxing import sandbox_options

REPO = Path(__file__).parents[3]


def _grade(tmp_path):
    shutil.copytree(REPO / "solutions", tmp_path / "reference")
    breaks_forward.write(tmp_path / "breaks_forward")
    options = config.GradeOptions(exercises=("flash_attention",), timeout_s=600.0, call_timeout_s=120.0,
                                  random_cases=0, secret="crash-test", **sandbox_options())
    batch = grade_cmd.grade([str(tmp_path / "reference"), str(tmp_path / "breaks_forward")], out=tmp_path / "out",
                            options=options)
    scores = {}
    for report in batch.reports:
        (score, result), = report.exercises
        scores[report.student] = ({line.part: line for line in score.lines if line.component == "correctness"},
                                  {p.name: p for p in result.parts}, result)
    return scores


def _others_score_as_the_reference(scores) -> None:
    lines, parts, _ = scores["breaks_forward"]
    ref_lines, ref_parts, _ = scores["reference"]
    for part in ("backward", "autograd"):
        assert lines[part].score == pytest.approx(ref_lines[part].score), parts[part].checks
        assert lines[part].score > 0
        assert [c.status for c in parts[part].checks] == [c.status for c in ref_parts[part].checks]


@pytest.mark.slow
def test_a_crashing_part_costs_only_its_own_checks(tmp_path):
    scores = _grade(tmp_path)
    lines, parts, _ = scores["breaks_forward"]
    assert lines["forward"].score == 0
    assert any("crashed with SIGSEGV" in c.message for c in parts["forward"].checks)
    _others_score_as_the_reference(scores)


@pytest.mark.gpu
def test_a_kernel_that_breaks_the_cuda_context_costs_only_its_own_check(tmp_path):
    scores = _grade(tmp_path)
    lines, parts, result = scores["breaks_forward"]
    ref_lines, _, _ = scores["reference"]
    assert lines["forward"].score == pytest.approx(ref_lines["forward"].score)  # its correctness cases are small
    assert parts["forward"].speed.status == "failed" and parts["forward"].speed.fraction == 0
    assert "left the CUDA context broken" in parts["forward"].speed.message
    assert any("illegal memory access" in p for p in result.problems)
    _others_score_as_the_reference(scores)
    assert parts["autograd"].speed.status == "measured" and parts["autograd"].speed.fraction > 0


@pytest.mark.parametrize("malformed", [True, False], ids=["malformed reply", "crash"])
def test_a_malformed_reply_ends_the_run_where_a_crash_goes_on_in_a_fresh_worker(tmp_path, malformed):
    """The supervisor's decision after a worker ends: a crash charges the item it was running and a fresh worker
    goes on with the rest; a reply the protocol does not allow ends the run (every item left is not run)."""
    from grader import exercises
    from grader.grading.exercise_run import item_plan, supervise, workers
    from grader.grading.isolation import processes
    from grader.grading.isolation.output_capture import Captured

    gelu = exercises.get("gelu")
    items = [it for it in item_plan.plan(gelu, device="cuda", secret="s", random_cases=2, speed_budget_s=1.0)
             if it.skip_reason is None]
    settings = RunSettings(device="cuda", secret="", random_cases=0, timeout_s=60.0, call_timeout_s=30.0,
                           memory_mb=None, speed_budget_s=1.0, workdir=tmp_path)
    sup = supervise._Supervision(gelu, Path("."), settings, scratch=tmp_path, cache_dir=None, on_reply=None,
                                 arbiter=None, defer_speed=True, references=None, items=items)
    sup.result.loaded, sup.current = True, items[0]
    quiet = Captured(b"", 0)
    outcome = processes.Outcome(-11, False, False, 1.0, quiet, quiet, 0)
    left = sup._after_end(None, workers.Ended("it ended", outcome, malformed=malformed), items, 0)
    if malformed:
        assert left == [] and all(it.id in sup.result.failed for it in items)
    else:
        assert sorted(it.id for it in left) == sorted(it.id for it in items[1:])
        assert list(sup.result.failed) == [items[0].id]
        kinds = [it.kind for it in left]  # the crashed item's kind last: the others run before it can crash again
        assert kinds.index(items[0].kind) > kinds.index(next(k for k in kinds if k != items[0].kind))
        assert kinds[kinds.index(items[0].kind):] == [items[0].kind] * kinds.count(items[0].kind)
