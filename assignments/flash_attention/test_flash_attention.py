"""Tests for the flash_attention exercise, generated from grader/exercises/flash_attention.py.
Run: pytest assignments/flash_attention"""

from grader.pytest_plugin import exercise_tests

globals().update(exercise_tests("flash_attention"))
