"""``grader grade --profile``'s window-by-window view of a batch: the runs in flight by exercise, the host's CPU busy
and each GPU's share held alone, from the runs' spans, the CPU samples and the arbiter's turns."""

from __future__ import annotations

import time

import pytest

from grader.grading.batch import timeline
from grader.grading.batch.timeline import Span
from grader.grading.isolation.gpu_arbiter import GpuArbiter
from tests.gates import ThreadProcess, until


def test_windows_are_about_fifteen_to_a_batch_in_tens_of_seconds():
    assert timeline.window_s(3.0) == 10.0
    assert timeline.window_s(349.0) == 30.0
    assert timeline.window_s(3600.0) == 240.0


def test_each_window_counts_the_runs_in_flight_the_cpu_busy_and_each_gpu_held_alone():
    runs = [(Span(0, 25), "flash_attention")] * 2 + [(Span(15, 40), "gelu")] + [(Span(32, 38), "gelu")]
    cpu = [(s, 0.9 if s <= 20 else 0.3) for s in range(1, 41)]  # a sample per second, said at its second's end
    gpus = [("cuda:0", [Span(5, 10), Span(22, 24)]), ("cuda:1", [])]
    lines = timeline.layout(runs, cpu, gpus, 40.0).splitlines()
    assert lines == [
        "  the batch every 10 s: exercise runs in flight, the host's CPU busy, cuda:0 held alone, cuda:1 held alone",
        "          0–10 s: 2 run(s) (flash_attention 2), CPU 90 %, cuda:0 alone 50 %, cuda:1 alone 0 %",
        "         10–20 s: 3 run(s) (flash_attention 2, gelu 1), CPU 90 %, cuda:0 alone 0 %, cuda:1 alone 0 %",
        "         20–30 s: 3 run(s) (flash_attention 2, gelu 1), CPU 30 %, cuda:0 alone 20 %, cuda:1 alone 0 %",
        "         30–40 s: 2 run(s) (gelu 2), CPU 30 %, cuda:0 alone 0 %, cuda:1 alone 0 %",
    ]
    # a last window shorter than the others: its share is of its own length; no CPU sample in it says so
    short = timeline.layout([], [], [("cuda:0", [Span(40, 44)])], 45.0).splitlines()
    assert short[-1] == "         40–45 s: 0 run(s), CPU ?, cuda:0 alone 80 %"


def test_the_arbiter_keeps_every_turn_for_the_profile():
    arbiter = GpuArbiter()
    timer = ThreadProcess(arbiter, "a timer", role="timer")
    try:
        before = time.monotonic()
        for _ in range(2):
            with timer.gate.alone():
                time.sleep(0.1)
        until(lambda: arbiter.alone_count == 2, "the arbiter counted both turns (it counts a turn as it ends)", 5,
              look_s=0.01)
        after = time.monotonic()
        assert len(arbiter.turns) == 2
        assert all(before <= start and start + 0.1 <= end <= after for start, end in arbiter.turns)
        assert arbiter.turns[0][1] <= arbiter.turns[1][0]
        assert sum(end - start for start, end in arbiter.turns) == pytest.approx(arbiter.alone_s)
    finally:
        timer.die()


def test_a_timeline_records_the_runs_and_samples_the_host(monkeypatch):
    samples = iter([(0.0, 100.0), (50.0, 200.0), (150.0, 300.0)] + [(150.0, 300.0)] * 1000)
    monkeypatch.setattr(timeline, "host_cpu", lambda: next(samples))
    monkeypatch.setattr(timeline, "SAMPLE_S", 0.01)
    started = time.monotonic()
    line = timeline.Timeline(started).start()
    line.ran("gelu", started + 1.0, started + 3.0)
    until(lambda: len(line.cpu) >= 2, "two samples of the host's CPU", 5, look_s=0.01)
    line.stop()
    assert [share for _, share in line.cpu[:2]] == [0.5, 1.0]
    [(span, exercise)] = line.runs
    assert exercise == "gelu" and span.start == pytest.approx(1.0) and span.end == pytest.approx(3.0)
    assert "1 run(s) (gelu 1)" in line.text([], 5.0)
