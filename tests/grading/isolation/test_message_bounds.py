"""What one submission can put in its reports is bounded: a worker's message (an exception's text, an error) is cut
to a stated size, with a note, before anything of the grader's keeps it."""

from __future__ import annotations

from pathlib import Path

from grader.grading import config
from grader.grading.commands import grade as grade_cmd
from grader.grading.isolation import protocol, wire
from grader.grading.isolation.wire_fields import MAX_TEXT

from ...sandboxing import sandbox_options


def test_a_huge_message_is_cut_when_it_is_decoded():
    huge = "x" * (MAX_TEXT * 50)
    for message in (protocol.Raised("i", huge), protocol.NotImplementedYet("i", huge), protocol.Poisoned(huge)):
        decoded = wire.decode(wire.encode(message))
        text = getattr(decoded, "message", None) or decoded.why
        assert len(text) < MAX_TEXT + 200 and "more characters cut" in text
    short = wire.decode(wire.encode(protocol.Raised("i", "ValueError: bad shape")))
    assert short.message == "ValueError: bad shape"


def test_an_exception_with_a_huge_message_keeps_the_reports_small(tmp_path: Path):
    """A 60-byte module whose call raises with a 5 MB message: each report stays within a few hundred kB."""
    folder = tmp_path / "student" / "gelu"
    folder.mkdir(parents=True)
    (folder / "gelu.py").write_text('def gelu(x):\n    raise ValueError("x" * 5_000_000)\n')
    options = config.GradeOptions(exercises=("gelu",), random_cases=0, secret="bounds", **sandbox_options())
    grade_cmd.grade([str(tmp_path / "student")], out=tmp_path / "out", options=options)
    reports = tmp_path / "out" / "students" / "student"
    sizes = {p.name: p.stat().st_size for p in reports.iterdir() if p.is_file()}
    assert sizes and max(sizes.values()) < 2_000_000, sizes  # 10+ checks, each message within 20k characters
    assert "more characters cut" in (reports / "report.md").read_text()
