"""The course file (grader.grading.config): the shipped one scales the exercises to its total and holds every
default; an instructor's file is laid over it; a malformed one is refused with what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader import exercises
from grader.grading import config

ALL = exercises.all_exercises()


def test_course_file_loads_and_scales_to_the_total():
    course = config.load_course(known=tuple(e.name for e in ALL))
    assert course.total > 0 and course.correctness in config.CORRECTNESS_MODES
    full = sum(course.factor(e, ALL) * e.max_points for e in ALL)
    assert full == pytest.approx(course.total)


def test_every_default_is_in_the_course_file():
    course = config.load_course()
    for key in config.PER_DEVICE:
        for device in config.DEVICES:
            assert course.setting(key, device) > 0 or key == "random_cases" or (key, device) == ("jobs", "cuda")
    assert course.setting("jobs", "cuda") == 0  # chosen per GPU (gpus.auto_jobs)
    settings = config.resolve(config.GradeOptions(), course, device="cpu", secret="s", workdir=Path("/w"))
    assert settings.random_cases == course.setting("random_cases", "cpu")
    assert settings.timeout_s == course.setting("timeout_s", "cpu")
    override = config.resolve(config.GradeOptions(random_cases=0, timeout_s=7.0), course, device="cuda", secret="s",
                              workdir=Path("/w"))
    assert (override.random_cases, override.timeout_s, override.call_timeout_s) == (0, 7.0, 7.0)


def test_an_instructors_course_file_is_laid_over_the_defaults(tmp_path):
    path = tmp_path / "course.toml"
    path.write_text("[weights]\ngelu = 2.0\n[grading]\nrandom_cases_cuda = 7\n")
    course = config.load_course(path)
    assert course.weight("gelu") == 2.0 and course.weight("softmax") == 1.0
    assert course.setting("random_cases", "cuda") == 7 and course.setting("random_cases", "cpu") == 5
    assert course.fingerprint() != config.load_course().fingerprint()


@pytest.mark.parametrize("text, message", [
    ("[course]\ntotal = 0\n", "total must be positive"),
    ("[grading]\ncorrectness = 'most'\n", "correctness must be one of"),
    ("[weights]\ngelu = -1\n", "must not be negative"),
    ("[course\n", "is not valid TOML"),
    ("[grading]\nrandom_case = 3\n", "unknown key\\(s\\) random_case"),
    ("[grading]\ntimeout_s_cuda = -5\n", "timeout_s must be positive"),
    ("[gradnig]\n", "unknown table"),
])
def test_bad_course_files_are_explained(tmp_path, text, message):
    path = tmp_path / "course.toml"
    path.write_text(text)
    with pytest.raises(config.CourseError, match=message):
        config.load_course(path)
