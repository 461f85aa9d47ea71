"""How the worker times the candidates of a student's ``@triton.autotune`` choice (grader.speed.autotune
``time_interleaved``): as ``triton.testing.do_bench`` would, but side by side, in interleaved rounds, so that a
drift of the GPU's clock while the choice is timed moves every candidate alike. On the CPU the GPU is a virtual
clock: each call "takes" its candidate's time, scaled by the clock's drift at that moment."""

from __future__ import annotations

import pytest

from grader.speed import autotune


class _Event:
    def __init__(self, device: _VirtualGpu):
        self.device, self.at = device, None

    def record(self) -> None:
        self.at = self.device.now

    def elapsed_time(self, end: _Event) -> float:
        return end.at - self.at


class _VirtualGpu:
    """Events, synchronization and cache clearing for ``time_interleaved``; ``call(ms)`` is a candidate whose
    every run takes ``ms`` times the drift at the moment it runs (``slowdown_per_ms``: the clock slows by that
    fraction per millisecond of work, as a GPU's clock falls under a long load)."""

    def __init__(self, slowdown_per_ms: float = 0.0):
        self.now, self.slowdown_per_ms, self.runs, self.clears = 0.0, slowdown_per_ms, {}, 0

    def event(self) -> _Event:
        return _Event(self)

    def synchronize(self) -> None:
        pass

    def clear_cache(self) -> None:
        self.clears += 1

    def call(self, name: str, ms: float):
        def run() -> None:
            self.runs[name] = self.runs.get(name, 0) + 1
            self.now += ms * (1.0 + self.slowdown_per_ms * self.now)

        return run


def test_each_candidate_is_timed_as_briefly_as_the_grader_says():
    """Per candidate: a first call, 5 to estimate its time, ``warmup_ms`` of calls, then the calls that fit in
    ``rep_ms`` (the grader's 2 + 10 ms: every millisecond of it, every other process on the GPU waits); the L2
    cache cleared before each of the estimate's and the timed calls."""
    gpu = _VirtualGpu()
    medians = [t[0] for t in autotune.time_interleaved([gpu.call("a", 0.5), gpu.call("b", 2.0)], device=gpu)]
    assert medians == pytest.approx([0.5, 2.0])
    assert (autotune.TUNE_WARMUP_MS, autotune.TUNE_REP_MS) == (2, 10)
    assert gpu.runs == {"a": 1 + 5 + 4 + 20, "b": 1 + 5 + 1 + 5}
    assert gpu.clears == (5 + 20) + (5 + 5)


def test_a_clock_drifting_while_a_choice_is_timed_does_not_pick_the_slower_candidate():
    """Two candidates 5 % apart, the faster listed last, each timed for 25 ms, the clock slowing as the GPU works.
    Timed one after the other (one round: what Triton's autotuner does), the drift makes the faster look slower and
    the slower is picked; in interleaved rounds both see the same clock and the faster wins, by about the true
    margin."""
    def medians(rounds: int) -> list[float]:
        gpu = _VirtualGpu(slowdown_per_ms=0.004)
        timed = autotune.time_interleaved([gpu.call("slower", 1.05), gpu.call("faster", 1.0)], warmup_ms=5.0,
                                          rep_ms=25.0, rounds=rounds, device=gpu)
        return [t[0] for t in timed]

    one_after_the_other = medians(1)
    assert one_after_the_other[1] > one_after_the_other[0]  # the known fault: the slower candidate would be chosen
    slower, faster = medians(autotune.TUNE_ROUNDS)
    assert faster < slower
    assert slower / faster == pytest.approx(1.05, abs=0.01)


def test_every_round_times_every_candidate_even_a_slow_one():
    """A candidate with fewer calls than there are rounds (a slow kernel: 25 ms of it is a few calls) sets the
    number of rounds, so that every round still holds a slice of every candidate and the drift is shared alike."""
    gpu, order = _VirtualGpu(), []
    gpu.synchronize = lambda: order.append("|")  # a round ends with a synchronization
    calls = [gpu.call("fast", 0.5), gpu.call("slow", 6.0)]
    traced = [lambda call=call, name=name: (order.append(name), call()) for call, name in zip(calls, ("fast", "slow"))]
    autotune.time_interleaved(traced, warmup_ms=5.0, rep_ms=25.0, device=gpu)
    untimed = 2 + (5 + 5) + (10 + 1)  # the first calls, the estimates, the warm-ups (5 ms: 10 and 1 calls)
    names = [k for k, x in enumerate(order) if x != "|"]
    timed = order[names[untimed]:]
    rounds = [r.split() for r in " ".join(timed).split("|") if r.strip()]
    assert [r.count("slow") for r in rounds] == [1, 1, 1, 1]  # 25 ms / 6 ms: 4 calls, one per round
    assert sum(r.count("fast") for r in rounds) == 50 and all(r.count("fast") in (12, 13) for r in rounds)
    assert [r[0] for r in rounds] == ["fast", "slow", "fast", "slow"]  # the order rotates from round to round


def test_a_candidate_triton_cannot_build_is_skipped_and_the_others_timed():
    from triton.runtime.errors import OutOfResources

    gpu = _VirtualGpu()

    def too_big() -> None:
        raise OutOfResources(300_000, 232_448, "shared memory")

    timed = autotune.time_interleaved([too_big, gpu.call("fits", 1.0)], device=gpu)
    assert timed[0] == [float("inf")] * 3 and timed[1][0] == pytest.approx(1.0)


def test_a_candidate_that_fails_otherwise_stops_the_choice():
    """Any other error is the student's call failing: raised, as Triton's autotuner raises it."""
    gpu = _VirtualGpu()

    def broken() -> None:
        raise ZeroDivisionError("in the student's pre-hook")

    with pytest.raises(ZeroDivisionError):
        autotune.time_interleaved([gpu.call("fine", 1.0), broken], device=gpu)


def test_each_candidate_of_a_choice_gets_its_own_timing_from_one_timing_of_all(monkeypatch):
    """Triton asks for one candidate's timing at a time: the first request times the whole choice at once (the calls
    Triton's ``_bench`` builds, one per candidate, in order), the others are answered from it; a candidate the
    choice's pruning did not list is timed on its own."""
    import types

    timings: list[list[str]] = []

    def time_interleaved(calls, **kw):
        names = [call() for call in calls]  # each call says which candidate it launches
        timings.append(names)
        return [[float(len(name))] * 3 for name in names]

    monkeypatch.setattr(autotune, "time_interleaved", time_interleaved)
    a, bb, ccc, extra = "a", "bb", "ccc", "dddd"
    tuner = types.SimpleNamespace(_grader_tuning=[a, bb, ccc], _grader_timed=None)

    def bench(self, *args, config, **meta):  # Triton's _bench: builds the call, hands it to do_bench
        return self.do_bench(lambda: config, quantiles=(0.5, 0.2, 0.8))

    answers = [autotune._timed_side_by_side(tuner, bench, (), c, {}) for c in (a, bb, ccc)]
    assert answers == [[1.0] * 3, [2.0] * 3, [3.0] * 3] and timings == [["a", "bb", "ccc"]]
    assert autotune._timed_side_by_side(tuner, bench, (), extra, {}) == [4.0] * 3
    assert timings[-1] == ["dddd"]


@pytest.mark.gpu
def test_on_a_gpu_interleaved_timing_measures_what_do_bench_measures():
    """Two matrix products of different sizes: the interleaved medians agree with ``do_bench``'s, each within 10 %
    (a GPU's clock moves by a few per cent between two timings of the same call)."""
    import torch
    import triton.testing

    a, b = (torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    c, d = (torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    calls = [lambda: a @ b, lambda: c @ d]
    interleaved = [t[0] for t in autotune.time_interleaved(calls, warmup_ms=25, rep_ms=100)]
    alone = [triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median") for call in calls]
    assert interleaved[0] > 4 * interleaved[1]  # 8 times the work
    for mine, theirs in zip(interleaved, alone):
        assert mine == pytest.approx(theirs, rel=0.10)
