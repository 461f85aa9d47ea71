"""Hypothesis profiles: ``student`` (default; quick), ``ci`` (derandomized: the same examples on
every run) and ``grading`` (thorough, for instructors). Select with ``--hypothesis-profile NAME``."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

DEFAULT = "student"
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.differing_executors]
# No "explain" phase: it lists lines of the grader's own code, which only confuses a student.
_PHASES = [p for p in Phase if p.name != "explain"]

# Kernels in the interpreter take milliseconds to seconds, so no deadline anywhere.
settings.register_profile("student", max_examples=10, deadline=None, suppress_health_check=_SLOW_OK, phases=_PHASES)
settings.register_profile(
    "ci", max_examples=12, deadline=None, derandomize=True, database=None,
    suppress_health_check=_SLOW_OK, phases=_PHASES,
)
settings.register_profile(
    "grading", max_examples=100, deadline=None, database=None, suppress_health_check=_SLOW_OK, phases=_PHASES
)
