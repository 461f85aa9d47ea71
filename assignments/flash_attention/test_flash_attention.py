"""Tests for the FlashAttention exercise, generated from grader/exercises/flash_attention.py, plus a memory
check. Run: pytest assignments/flash_attention"""

from pathlib import Path

import pytest

from grader import exercises
from grader.exercises import flash_attention as spec
from grader.pytest_tests import exercise_tests

globals().update(exercise_tests("flash_attention"))


def test_forward_memory(grader_session, request):
    """FlashAttention (forward): a long sequence must not allocate an Nq×Nk score matrix."""
    exercise = exercises.get("flash_attention")
    module = grader_session.ready(exercise, exercise.part("forward"), Path(str(request.node.path)))
    verdict = spec.check_memory(module, grader_session.device)
    if not verdict.passed:
        pytest.fail(verdict.message, pytrace=False)
