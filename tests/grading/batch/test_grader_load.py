"""``--profile``'s view of the grader's own process: its CPU per kind of thread, and how late its threads get to
run Python (the interpreter lock) when many want it."""

from __future__ import annotations

import sys
import threading
import time

from grader.grading.batch import grader_load


def _burn(cpu_s: float, done: threading.Event, hold: threading.Event) -> None:
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        sum(range(1000))
    done.set()
    hold.wait(30)  # alive until the test has looked


def test_cpu_is_given_to_the_kind_of_thread_that_used_it():
    load = grader_load.GraderLoad().start()
    done, hold = threading.Event(), threading.Event()
    thread = threading.Thread(target=_burn, args=(0.3, done, hold), name="judge scratch-alice-gelu", daemon=True)
    thread.start()
    assert done.wait(60)
    load.stop()
    hold.set()
    by_kind = load.cpu_by_kind()
    assert by_kind.get("judging", 0.0) >= 0.25, by_kind
    assert by_kind.get("judging", 0.0) < 5.0, by_kind
    assert grader_load.kind_of("slot cuda:0#3") == "exercise runs (planning, inputs, workers)"
    assert grader_load.kind_of("Thread-7 (something)") == grader_load.OTHER


def test_cpu_of_threads_python_did_not_start_is_counted_as_theirs():
    """torch's CPU thread pool (the judging's tensor arithmetic runs there) is counted, not lost as unattributed."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(1 << 22, dtype=torch.float64)
        x.sin()  # the pool's threads exist before the profile starts: only their CPU from then on counts
        load = grader_load.GraderLoad().start()
        start = time.process_time()
        while time.process_time() - start < 2.0:
            x.sin()
        load.stop()
    finally:
        torch.set_num_threads(threads)
    by_kind = load.cpu_by_kind()
    assert by_kind.get(grader_load.NATIVE, 0.0) >= 0.2, by_kind
    assert sum(by_kind.values()) < time.process_time() - start + 1.0, by_kind


def test_a_thread_holding_the_interpreter_makes_the_others_late():
    """With the interpreter handed over only every 100 ms, a busy thread keeps the ticker waiting for about that."""
    load = grader_load.GraderLoad().start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.1)
    try:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            sum(range(1000))
    finally:
        sys.setswitchinterval(interval)
    load.stop()
    lags = load.lags()
    assert lags and lags[-1] >= 0.03, lags[-5:]
    text = load.text(own_cpu_s=1.0)
    assert "ms at most" in text and f"{len(lags)} wake-ups" in text


def test_percentile():
    values = sorted([0.001] * 90 + [0.05] * 10)
    assert grader_load.percentile(values, 0.5) == 0.001
    assert grader_load.percentile(values, 0.95) == 0.05
    assert grader_load.percentile([], 0.5) == 0.0
