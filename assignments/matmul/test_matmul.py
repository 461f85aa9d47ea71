"""Tests for the matmul exercise, generated from grader/exercises/matmul.py. Run: pytest assignments/matmul"""

from grader.pytest_plugin import exercise_tests

globals().update(exercise_tests("matmul"))
