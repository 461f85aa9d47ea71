"""Tests for the gelu exercise, generated from grader/exercises/gelu.py. Run: pytest assignments/gelu"""

from grader.pytest_plugin import exercise_tests

globals().update(exercise_tests("gelu"))
