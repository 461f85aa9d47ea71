"""Per-student extensions: ``grader serve extend`` moves one student's deadline for an exercise (with a reason, in
the audit log); that student's submissions are on time until then, everyone else's are late (marked, or refused
under ``late = "refuse"``); the student's page shows their own deadline."""

from __future__ import annotations

import datetime as dt

import pytest

from grader import cli, exercises
from grader.serve import audit, extensions, intake, queue
from grader.serve import policy as policy_mod
from grader.serve.db import Database

from . import serve_helpers as helpers

GELU = tuple(e for e in exercises.all_exercises() if e.name == "gelu")
DUE = dt.datetime(2025, 10, 10, 23, 59).timestamp()
DAY = 24 * 3600.0


def _accept(db, folder, student: str, upload, rules: policy_mod.Policy) -> intake.Accepted:
    return intake.accept(db, folder=folder, student=student, filename="a.zip", data_file=upload,
                         size=upload.stat().st_size, policy=rules, selected=GELU, now=DUE + DAY)


@pytest.mark.parametrize("late", ["mark", "refuse"])
def test_an_extended_student_is_on_time_when_the_others_are_late(tmp_path, late):
    folder = tmp_path / "serve-dir"
    helpers.add_students(folder, "alice", "bob")
    db = Database.in_folder(folder)
    rules = policy_mod.Policy(submissions_per_hour=100, queued_per_student=10, late=late, deadlines={"gelu": DUE})
    extensions.grant(db, "alice", "gelu", DUE + 2 * DAY, "medical certificate", policy=rules)
    upload = helpers.gelu_zip(tmp_path / "a.zip")
    assert _accept(db, folder, "alice", upload, rules).late == []
    if late == "mark":
        assert _accept(db, folder, "bob", upload, rules).late == ["gelu"]
    else:
        with pytest.raises(queue.Refused, match="the deadline of gelu has passed") as refused:
            _accept(db, folder, "bob", upload, rules)
        assert refused.value.status == 403
    shown = extensions.policy_for(db, rules, "alice").to_dict()["deadlines"]["gelu"]
    assert shown == dt.datetime.fromtimestamp(DUE + 2 * DAY, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    assert extensions.policy_for(db, rules, "bob").deadlines == {"gelu": DUE}


def test_an_extension_never_shortens_a_deadline():
    rules = policy_mod.Policy(deadlines={"gelu": DUE})
    assert rules.with_extensions({"gelu": DUE - DAY}).deadlines == {"gelu": DUE}


def test_the_extend_command_grants_logs_and_refuses_what_it_cannot_do(tmp_path, capsys):
    folder = tmp_path / "serve-dir"
    helpers.add_students(folder, "alice")
    course = tmp_path / "course.toml"
    course.write_text('[serve.deadlines]\ngelu = "2025-10-10T23:59:00"\n')

    def extend(*args: str) -> tuple[int, str]:
        status = cli.main(["serve", "extend", *args, "--course", str(course), "--dir", str(folder)])
        return status, capsys.readouterr().err

    status, err = extend("alice", "gelu", "2025-10-12", "--reason", "medical certificate")
    assert status == 0, err
    db = Database.in_folder(folder)
    until = extensions.of_student(db, "alice")["gelu"]
    assert dt.datetime.fromtimestamp(until).strftime("%Y-%m-%d %H:%M:%S") == "2025-10-12 23:59:59"
    assert "gelu until" in audit.entries(db, action="extension")[0].detail
    for args, message in ((("alice", "softmax", "2025-10-12"), "softmax has no deadline in the course file"),
                          (("alice", "gelu", "next week"), "'next week' is not a date and time"),
                          (("mallory", "gelu", "2025-10-12"), "mallory is not on the roster")):
        status, err = extend(*args, "--reason", "x")
        assert status == 2 and message in err, (args, err)
    status, err = extend("alice", "gelu", "2025-10-12", "--reason", " ")
    assert status == 2 and "an extension needs a reason" in err
