"""scripts/gpu_sharing_ab.py reads the arbiter's counts off the profile ``grader grade --profile`` prints (and off
the line of a grader that does not chain turns), and its arm O grades with the earlier checkout's grader."""

import csv
import importlib.util
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from grader.grading.batch import profiling
from grader.grading.exercise_run.slots import Slot
from grader.grading.isolation import gpu_arbiter
from tests.manual_clock import ManualClock

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_sharing_ab", ROOT / "scripts" / "gpu_sharing_ab.py")
ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab)


def test_the_arbiters_counts_are_read_off_the_profile(monkeypatch):
    monkeypatch.setattr(profiling, "gpu_references", SimpleNamespace(of=lambda arbiter: None))
    arbiter = gpu_arbiter.GpuArbiter(clock=ManualClock())
    arbiter.alone_s, arbiter.alone_count, arbiter.chained = 41.7, 90, 38
    arbiter.alone_by_role = {"timer": 25.0, "worker": 16.7}
    arbiter.drain_s, arbiter.queue_s = 8.25, 30.5
    slot = Slot("cuda:0", {"kind": "cuda", "name": "fake GPU", "index": 0}, arbiter=arbiter)
    notes: list[str] = []
    profiling.report(SimpleNamespace(started=time.monotonic() - 200.0, done=3, note=notes.append), [slot],
                     submissions=3)
    assert ab.arbiter_counts(notes[0]) == {"alone_s": "41.7", "turns": "90", "chained": "38", "drain_s": "8.2",
                                           "queue_s": "30.5"}
    unchained = ("  cuda:0 (NVIDIA H200): 8 run(s) at once; held alone 10.7 s (14% of the wall time: timer 6.1 s) "
                 "in 27 turn(s); waiting for the others' GPU work before them 5.2 s in all, for their turn (that wait "
                 "included) 12.6 s")  # a grader that does not chain turns
    assert ab.arbiter_counts(unchained) == {"alone_s": "10.7", "turns": "27", "chained": "", "drain_s": "5.2",
                                            "queue_s": "12.6"}
    assert ab.arbiter_counts("graded 3 submissions on the CPU") == {}


def test_arm_o_grades_with_the_earlier_checkouts_grader_and_only_this_checkouts_arms_get_args(
        monkeypatch, tmp_path, capsys):
    before = tmp_path / "before"
    (before / "grader").mkdir(parents=True)
    (before / "grader" / "cli.py").write_text("")
    calls = []
    monkeypatch.setattr(ab, "grade", lambda submissions, out, limit_s, *, home, args:
                        calls.append((home, args, len(submissions))) or (1.0, "", 0))
    ab.main(["--order", "AO", "--copies", "2", "--before", str(before), "--before-commit", "abc1234",
             "--commit", "def5678", "--args=--no-yardstick", "--warm-up", "--header", "--note", "alone on the host"])
    assert calls == [(ab.ROOT, ("--no-yardstick",), 2), (ab.ROOT, ("--no-yardstick",), 2), (before.resolve(), (), 2)]
    rows = [dict(zip(ab.FIELDS, line.split(","))) for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r["batch"], r["arm"], r["grader_commit"], r["grader_args"]) for r in rows] == [
        ("0", "A", "def5678", "--no-yardstick"), ("1", "A", "def5678", "--no-yardstick"), ("2", "O", "abc1234", "")]
    cores = str(len(os.sched_getaffinity(0)))
    assert {(r["cores"], r["note"]) for r in rows} == {(cores, "alone on the host")}


def test_arm_o_without_an_earlier_checkout_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ab.main(["--order", "AO", "--before", str(tmp_path)])
    assert "arm O needs --before DIR" in capsys.readouterr().err


def test_the_scripts_rows_have_the_columns_of_the_data_file():
    with open(ROOT / "docs" / "data" / "gpu-sharing-ab.csv", newline="", encoding="utf-8") as f:
        assert next(csv.reader(f)) == ab.FIELDS
