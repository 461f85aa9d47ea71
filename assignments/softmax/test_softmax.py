"""Tests for the softmax exercise, generated from grader/exercises/softmax.py. Run: pytest assignments/softmax"""

from grader.pytest_plugin import exercise_tests

globals().update(exercise_tests("softmax"))
