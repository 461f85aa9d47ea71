"""Tests for the rmsnorm exercise, generated from grader/exercises/rmsnorm.py. Run: pytest assignments/rmsnorm"""

from grader.pytest_plugin import exercise_tests

globals().update(exercise_tests("rmsnorm"))
