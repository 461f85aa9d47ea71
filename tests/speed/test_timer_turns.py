"""The trusted timer's steps, on the CPU with the GPU work stood in for (the real replays run under ``-m gpu`` in
tests/speed/test_gpu_trusted_timer.py): every benchmark of a part is loaded and validated sharing the GPU, all are timed
in one turn alone, then each is validated again; a failure stops the benchmarks after it, as it always did; and a
crash is charged to the benchmark whose kernels were running (``progress.txt``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grader import exercises
from grader.checks import gpu_gate
from grader.speed import timer, trusted
from grader.speed.measure import BenchmarkTiming
from grader.speed.stats import summarize

PART = exercises.get("rmsnorm").part("forward")  # four benchmarks
LABELS = [b.label for b in PART.benchmarks]


class _Plan:
    outputs: tuple[str, ...] = ("y",)

    def summary(self) -> str:
        return "1 launch"


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """The GPU work of the timer stood in for: ``gpu.validations`` (label -> results, in order), ``gpu.fail``
    (label whose timed rounds raise), and what ran, in order (``gpu.log``)."""

    fake = SimpleNamespace(validations={}, fail=None, log=[])

    def validate(part, bench, replay, seed):
        fake.log.append(f"validate {bench.label}")
        fake.turns.stretch.append(bench.label)
        queue = fake.validations.get(bench.label, [])
        return queue.pop(0) if queue else None

    def measure_benchmark(part, replay, bench, **kw):
        fake.log.append(f"time {bench.label} ({'alone' if fake.turns.depth else 'shared'})")
        if bench.label == fake.fail:
            raise RuntimeError("an illegal memory access was encountered")
        return BenchmarkTiming(bench.label, times={"student": summarize([1.0, 1.1])},
                               warmup_s=0.25, timed_s=0.5)

    class Turns(gpu_gate.NoGate):
        """Counts the turns alone, and knows whether one is held now; ``stretches``: what each use() stretch
        validated."""

        turns = depth = 0

        def __init__(self):
            self.stretches: list[list[str]] = []
            self.stretch: list[str] = []  # outside a stretch: never looked at

        @contextlib.contextmanager
        def use(self):
            self.stretches.append([])
            self.stretch = self.stretches[-1]
            try:
                yield
            finally:
                self.stretch = []

        @contextlib.contextmanager
        def alone(self):
            self.turns += 1
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1

    fake.turns = Turns()
    monkeypatch.setattr(gpu_gate, "_current", fake.turns)
    monkeypatch.setattr(trusted.measure, "input_sets", lambda part, bench, sets, device: [{"x": torch.zeros(4)}])
    monkeypatch.setattr(trusted.plan_checks, "problems", lambda plan, input_bytes, output_names: [])
    monkeypatch.setattr(trusted.replay_mod, "Replay", lambda plan, folder: object())
    monkeypatch.setattr(trusted, "validate", validate)
    monkeypatch.setattr(trusted.measure, "measure_benchmark", measure_benchmark)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    return fake


def _run(tmp_path: Path) -> tuple[timer.TimerResult, list[str]]:
    job = timer.TimerJob("rmsnorm", "forward", 4.0, {label: _Plan() for label in LABELS})
    result = timer.run(job, tmp_path, index=0)
    return result, (tmp_path / timer.PROGRESS).read_text().splitlines()


def test_a_parts_benchmarks_are_validated_then_timed_in_one_turn_then_validated_again(gpu, tmp_path):
    result, progress = _run(tmp_path)
    assert gpu.turns.turns == 1
    assert gpu.log == ([f"validate {label}" for label in LABELS] + [f"time {label} (alone)" for label in LABELS]
                       + [f"validate {label}" for label in LABELS])
    rows = [BenchmarkTiming.from_dict(r) for r in result.benchmarks]
    assert [r.label for r in rows] == LABELS and all(r.error is None for r in rows)
    assert all(r.warmup_s >= 0.25 and any(n.startswith("timed by replaying") for n in r.notes) for r in rows)
    assert progress[-1] == f"0 {LABELS[-1].replace(' ', '_')}"


def test_each_validation_is_a_stretch_of_gpu_work_of_its_own(gpu, tmp_path):
    """A pause for another process's turn waits for the stretch under way: one benchmark's validation, never the
    whole part's."""
    _run(tmp_path)
    assert gpu.turns.stretches == [[label] for label in LABELS] * 2


def test_a_replay_that_fails_while_timed_stops_the_benchmarks_after_it(gpu, tmp_path):
    gpu.fail = LABELS[1]
    result, progress = _run(tmp_path)
    rows = [BenchmarkTiming.from_dict(r) for r in result.benchmarks]
    assert [r.label for r in rows] == LABELS[:2]
    assert rows[0].error is None and "illegal memory access" in rows[1].error
    assert f"time {LABELS[2]} (alone)" not in gpu.log  # not timed after the failure
    assert f"0 {LABELS[1].replace(' ', '_')}" in progress  # said before its rounds: a crash there is charged to it


def test_a_replay_that_is_not_the_function_is_never_timed_and_stops_the_rest(gpu, tmp_path):
    gpu.validations = {LABELS[1]: ["y differs (relative L2 error 1)"]}
    result, _ = _run(tmp_path)
    rows = [BenchmarkTiming.from_dict(r) for r in result.benchmarks]
    assert [r.label for r in rows] == LABELS[:2]
    assert "did not compute the function" in rows[1].error and rows[1].times == {}
    assert result.mismatches == [f"{LABELS[1]}: y differs (relative L2 error 1)"]
    assert gpu.log.count(f"validate {LABELS[2]}") == 0 and gpu.turns.turns == 1  # only the first was timed


def test_a_replay_found_wrong_after_its_rounds_loses_its_times(gpu, tmp_path):
    gpu.validations = {LABELS[0]: [None, "y differs after the rounds"]}
    result, _ = _run(tmp_path)
    rows = [BenchmarkTiming.from_dict(r) for r in result.benchmarks]
    assert [r.label for r in rows] == LABELS[:1]
    assert "did not compute the function" in rows[0].error and rows[0].times == {}
