"""The batch's reference store: the hidden cases' inputs and float64 references are computed once per batch and
reused by every later student; a record that was changed or comes from another batch is refused by name and
computed again, never used."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grader import exercises
from grader.checks import tensors
from grader.checks.spec import Case
from grader.grading import config
from grader.grading.commands import grade as grade_cmd
from grader.grading.exercise_run import references
from grader.grading.exercise_run.case_references import COMPUTING, WAITING, CaseReferences
from grader.grading.exercise_run.references import ReferenceStore
from grader.grading.results import store
from tests.gates import until

from ...sandboxing import sandbox_options

REPO = Path(__file__).parents[3]


def _case(part, seed: int = 7) -> Case:
    return part.examples[0].with_seed(seed)


def _fill(folder: Path, secret: str = "s1"):
    part = exercises.get("gelu").part("forward")
    case = _case(part)
    refs = CaseReferences(ReferenceStore(folder, secret), "gelu")
    inputs = refs.inputs(part, case)
    expected = refs.expected(part, case, inputs)
    assert (refs.computed, refs.reused) == (1, 0)
    return part, case, inputs, expected


def test_a_second_run_reuses_the_stored_reference(tmp_path):
    part, case, inputs, expected = _fill(tmp_path)
    again = CaseReferences(ReferenceStore(tmp_path, "s1"), "gelu")
    loaded = again.inputs(part, case)
    assert all(torch.equal(loaded[k], v) for k, v in inputs.items() if isinstance(v, torch.Tensor))
    got = again.expected(part, case, loaded)
    assert all(torch.equal(got[k], v) for k, v in expected.items())
    assert (again.computed, again.reused) == (0, 1)


def test_another_case_is_not_served_from_the_store(tmp_path):
    part, _, _, _ = _fill(tmp_path)
    other = CaseReferences(ReferenceStore(tmp_path, "s1"), "gelu")
    other_case = _case(part, seed=8)
    other.expected(part, other_case, other.inputs(part, other_case))
    assert (other.computed, other.reused) == (1, 0)


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "another batch's secret"])
def test_a_changed_or_foreign_record_is_refused_by_name_and_computed_again(tmp_path, damage, capsys):
    part, case, _, expected = _fill(tmp_path)
    path = ReferenceStore(tmp_path, "s1").path("gelu", part, case)
    secret = "s1"
    if damage == "flip a byte":
        blob = bytearray(path.read_bytes())
        blob[-10] ^= 0xFF
        path.write_bytes(bytes(blob))
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    else:
        secret = "s2"  # the same files, read by a batch with another secret (a copied folder)
    reader = ReferenceStore(tmp_path, secret)
    refs = CaseReferences(reader, "gelu")
    got = refs.expected(part, case, refs.inputs(part, case))
    assert (refs.computed, refs.reused) == (1, 0)  # never used: computed again
    assert len(reader.refused) == 1 and path.name in reader.refused[0]
    assert "refused the stored reference gelu/forward/" + path.name in capsys.readouterr().err
    assert all(torch.equal(got[k], v) for k, v in expected.items())


def test_a_forged_record_with_wrong_outputs_is_refused(tmp_path):
    """A record rewritten whole (right format, wrong reference) without the secret cannot be signed."""
    part, case, inputs, expected = _fill(tmp_path)
    forger = ReferenceStore(tmp_path, "not-the-secret")
    path = ReferenceStore(tmp_path, "s1").path("gelu", part, case)
    forged = {k: torch.zeros_like(v) for k, v in expected.items()}
    forger.save("gelu", part, case, inputs, forged)  # same path: the name does not depend on the secret
    assert forger.path("gelu", part, case) == path
    reader = ReferenceStore(tmp_path, "s1")
    refs = CaseReferences(reader, "gelu")
    got = refs.expected(part, case, refs.inputs(part, case))
    assert reader.refused and all(torch.equal(got[k], v) for k, v in expected.items())


def test_a_record_read_once_comes_from_memory_until_its_file_changes(tmp_path, capsys):
    part, case, inputs, _ = _fill(tmp_path)
    reader = ReferenceStore(tmp_path, "s1")
    first = reader.load("gelu", part, case)
    assert all(torch.equal(first[0][k], v) for k, v in inputs.items() if isinstance(v, torch.Tensor))
    assert reader.load("gelu", part, case) is first and reader.reads == 1  # the same record, not read again
    path = reader.path("gelu", part, case)
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    path.write_bytes(bytes(blob))  # changed after it was kept: its size and time say so
    assert reader.load("gelu", part, case) is None and reader.reads == 2
    assert reader.refused and "refused the stored reference" in capsys.readouterr().err


@pytest.mark.parametrize("exercise, part_name", [(e.name, p.name) for e in exercises.all_exercises()
                                                  for p in e.parts])
def test_a_reference_leaves_its_inputs_as_they_were(exercise, part_name):
    """A record's inputs are shared by every run of the process once kept: computing the reference (or anything
    else the grader does with them) must never change them in place."""
    part = exercises.get(exercise).part(part_name)
    for case in part.examples[:2]:
        inputs = part.make_inputs(case)
        before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        references._on_cpu(part, inputs)
        assert all(tensors.same_bits(inputs[k], v) for k, v in before.items()), case


def test_the_records_kept_are_bounded_latest_first(tmp_path):
    part = exercises.get("gelu").part("forward")
    cases = [_case(part, seed) for seed in (1, 2, 3)]
    writer = CaseReferences(ReferenceStore(tmp_path, "s1"), "gelu")
    for case in cases:
        writer.expected(part, case, writer.inputs(part, case))
    reader = ReferenceStore(tmp_path, "s1")
    one = references._nbytes(reader.load("gelu", part, cases[0]))
    reader.kept_bytes = 2 * one  # room for two of the three
    for case in cases[1:]:
        reader.load("gelu", part, case)
    assert reader.reads == 3
    reader.load("gelu", part, cases[2])
    assert reader.reads == 3  # among the latest two: kept
    reader.load("gelu", part, cases[0])
    assert reader.reads == 4  # the oldest was dropped: read again


def test_a_batch_computes_each_reference_once(tmp_path, monkeypatch):
    """Two students of one batch: the second computes no reference (the state files record the counts) and reads
    none from its file (kept in memory when the first stored them); grading them leaves every kept record as it
    was."""
    kept = []
    keep = ReferenceStore._keep

    def remember(store_, path, version, record):
        kept.append((store_, path, record, [(name, t.clone()) for values in record for name, t in values.items()
                                            if isinstance(t, torch.Tensor)]))
        keep(store_, path, version, record)

    monkeypatch.setattr(ReferenceStore, "_keep", remember)
    shutil.copytree(REPO / "solutions", tmp_path / "a")
    shutil.copytree(REPO / "solutions", tmp_path / "b")
    out = tmp_path / "out"
    options = config.GradeOptions(exercises=("gelu",), jobs=1, timeout_s=120.0, call_timeout_s=20.0, random_cases=3,
                                  secret="test-secret", **sandbox_options())
    grade_cmd.grade([str(tmp_path / "a"), str(tmp_path / "b")], out=out, options=options)
    counts = {s: json.loads((out / "students" / s / "state" / "gelu.json").read_text())["counts"]
              for s in store.students(out)}
    first, second = sorted(counts.values(), key=lambda c: -c["references computed"])
    assert first["references computed"] > 0 and first["references reused"] == 0
    assert (second["references computed"], second["references reused"]) == (0, first["references computed"])
    assert any((out / store.REFERENCES / "gelu" / "forward").iterdir())
    assert len({id(s) for s, *_ in kept}) == 1  # one store for the batch
    assert len({path for _, path, _, _ in kept}) == first["references computed"]
    assert kept[0][0].reads == 0  # the second student's records came from memory
    assert kept[0][0].drawn == first["references computed"]  # and the second drew no inputs
    for _, path, record, snapshot in kept:  # what the runs were handed was only read
        now = [(name, t) for values in record for name, t in values.items() if isinstance(t, torch.Tensor)]
        assert [n for n, _ in now] == [n for n, _ in snapshot], path
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(now, snapshot, strict=True)), path


def test_runs_that_need_a_case_at_once_compute_it_once(tmp_path):
    """Eight runs of one process ask for the same case's reference at the same moment: one computes, seven wait
    for it and load it."""
    import dataclasses
    import threading
    import time

    real = exercises.get("gelu").part("forward")
    calls = []

    def slow_reference(inputs):
        calls.append(1)
        time.sleep(0.3)
        return real.reference(inputs)

    part = dataclasses.replace(real, reference=slow_reference)
    case = _case(real)
    store_ = ReferenceStore(tmp_path, "s1")
    runs = [CaseReferences(store_, "gelu") for _ in range(8)]
    inputs = part.make_inputs(case)
    barrier = threading.Barrier(len(runs))
    results = [None] * len(runs)

    def ask(i):
        barrier.wait()
        results[i] = runs[i].expected(part, case, inputs)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert sum(r.computed for r in runs) == 1 and sum(r.reused for r in runs) == 7
    assert all(torch.equal(r["y"], results[0]["y"]) for r in results)
    # --profile: the run that computed spent its time computing, the seven others theirs waiting for it
    computing = next(r for r in runs if r.computed)
    assert computing.seconds[COMPUTING] >= 0.3 and computing.seconds[WAITING] == 0
    for r in runs:
        if r is not computing:
            assert r.seconds[WAITING] >= 0.2 and r.seconds[COMPUTING] == 0, r.seconds



def _counted(real, calls: list, delay_s: float = 0.0):
    """``real`` with a ``make_inputs`` that counts its calls (and takes ``delay_s``)."""
    import dataclasses

    def make_inputs(case):
        calls.append(case)
        time.sleep(delay_s)
        return real.make_inputs(case)

    return dataclasses.replace(real, make_inputs=make_inputs)


def test_runs_that_need_a_cases_inputs_at_once_draw_them_once(tmp_path):
    """The batch's first students, side by side: eight runs ask for the inputs of a case no record holds at the same
    moment; one draws them, the others wait and get the same tensors."""
    import threading

    calls = []
    part = _counted(exercises.get("gelu").part("forward"), calls, delay_s=0.3)
    case = _case(part)
    store_ = ReferenceStore(tmp_path, "s1")
    runs = [CaseReferences(store_, "gelu") for _ in range(8)]
    barrier = threading.Barrier(len(runs))
    got = [None] * len(runs)

    def ask(i):
        barrier.wait()
        got[i] = runs[i].inputs(part, case)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and store_.drawn == 1
    assert all(g is got[0] for g in got)
    assert torch.equal(got[0]["x"], part.make_inputs(case)["x"])  # the case's own inputs


def test_drawn_inputs_are_kept_until_the_record_holds_them(tmp_path):
    calls = []
    part = _counted(exercises.get("gelu").part("forward"), calls)
    case = _case(part)
    store_ = ReferenceStore(tmp_path, "s1")
    first, second = CaseReferences(store_, "gelu"), CaseReferences(store_, "gelu")
    inputs = first.inputs(part, case)
    assert second.inputs(part, case) is inputs and len(calls) == 1  # drawn once, not stored yet
    first.expected(part, case, inputs)  # computed and stored with its inputs
    assert not store_._drawn and store_._drawn_total == 0  # the record holds them now
    third = CaseReferences(store_, "gelu")
    assert third.inputs(part, case) is inputs and third.reused == 1 and len(calls) == 1  # from the record


def test_the_drawn_inputs_kept_are_bounded_latest_first(tmp_path, monkeypatch):
    calls, real = [], exercises.get("gelu").part("forward")
    part = _counted(real, calls)
    cases = [_case(part, seed) for seed in (1, 2)]
    store_ = ReferenceStore(tmp_path, "s1")
    one = references._nbytes((real.make_inputs(cases[0]),))
    monkeypatch.setattr(references, "DRAWN_BYTES", one)  # room for one
    run = CaseReferences(store_, "gelu")
    run.inputs(part, cases[0])
    run.inputs(part, cases[1])
    run.inputs(part, cases[1])
    assert len(calls) == 2  # the latest kept
    run.inputs(part, cases[0])
    assert len(calls) == 3 and store_.drawn == 3  # the oldest was dropped: drawn again


_ONE_PROCESS = """
import os, sys, time
from pathlib import Path
from grader import exercises
from grader.grading.exercise_run.references import ReferenceStore, _on_cpu

folder, log = Path(sys.argv[1]), Path(sys.argv[2])
part = exercises.get("gelu").part("forward")
case = part.examples[0].with_seed(7)
inputs = part.make_inputs(case)

def compute(part, inputs):
    with open(log, "a") as f:
        f.write("computed\\n")
    time.sleep(1.0)
    return _on_cpu(part, inputs)

(folder / f"ready-{os.getpid()}").write_text("")
while not (folder / "go").exists():
    time.sleep(0.01)
_, computed = ReferenceStore(folder, "s1").reference("gelu", part, case, inputs, compute=compute)
print("computed" if computed else "loaded")
"""


def test_processes_that_need_a_case_at_once_compute_it_once(tmp_path):
    """Two grader processes (a split batch's children, Slurm array tasks) ask for one case at once: one computes it,
    the other waits for its lock and loads what it stored."""
    log = tmp_path / "log"
    script = tmp_path / "one.py"
    script.write_text(_ONE_PROCESS)
    (tmp_path / "refs").mkdir()
    children = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "refs"), str(log)], cwd=REPO,
                                 stdout=subprocess.PIPE, text=True) for _ in range(2)]
    until(lambda: len(list((tmp_path / "refs").glob("ready-*"))) == 2,  # both have imported torch: they start together
          "both processes ready", 120, look_s=0.05)
    (tmp_path / "refs" / "go").write_text("")
    said = sorted(child.communicate(timeout=120)[0].strip() for child in children)
    assert said == ["computed", "loaded"]
    assert log.read_text().count("computed") == 1
