"""An autotuner timing its configs in the worker has the GPU alone (grader.speed.autotune): one turn per choice,
one for all of a part's choices, none for a choice another of the student's workers already timed; a choice's
candidates are timed together by the grader's timing, never by the student's benchmarker."""

from __future__ import annotations

import contextlib
import types

import pytest

from grader.checks import gpu_gate


class _TurnCounter(gpu_gate.NoGate):
    """The process's gate: counts the turns alone asked for."""

    def __init__(self):
        self.turns = 0

    def alone(self):
        self.turns += 1
        return super().alone()


def _autotuned_add_one(monkeypatch, timings: list | None = None) -> tuple:
    """A two-config autotuned kernel, Triton's autotuner patched in TUNE mode, and the turn counter; timing needs a
    GPU, so every config "takes" 1 ms (the interpreter cannot time; the calls are not run). ``timings`` gets the
    number of candidates of each timing of a choice's candidates."""
    import triton
    import triton.language as tl

    from grader.speed import autotune

    counter = _TurnCounter()
    monkeypatch.setattr(gpu_gate, "_current", counter)
    autotune.install(default=autotune.TUNE)

    def time_interleaved(calls, **kw):
        if timings is not None:
            timings.append(len(calls))
        return [[1.0, 1.0, 1.0] for _ in calls]

    monkeypatch.setattr(autotune, "time_interleaved", time_interleaved)

    @triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])
    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    # the student's own benchmarker, which TUNE mode replaces
    monkeypatch.setitem(add_one.__dict__, "do_bench", lambda fn, quantiles=None, **kw: [1.0, 1.0, 1.0])

    _ADD_ONE_KERNEL[:], _ADD_ONE_TUNER[:] = [add_one.fn], [add_one]

    def call(x, n: int) -> None:
        add_one[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, n)

    return call, counter


_ADD_ONE_KERNEL: list = []  # the kernel under _autotuned_add_one's autotuner
_ADD_ONE_TUNER: list = []  # that autotuner


@pytest.mark.parametrize("timed_calls", [1, 2])
def test_an_autotuner_timing_its_configs_has_the_gpu_alone_once_per_choice(monkeypatch, timed_calls):
    """Triton's autotuner in the worker's TUNE mode: the configs are timed with the GPU alone, in one turn per
    choice; a call whose choice is cached asks for nothing (the interpreter runs the chosen config)."""
    import torch

    from grader.speed import autotune

    add_one, counter = _autotuned_add_one(monkeypatch)
    x = torch.zeros(100)
    with autotune.mode(autotune.TUNE):
        for _ in range(timed_calls):
            add_one(x, 100)
    assert counter.turns == 1
    assert torch.equal(x, torch.full((100,), float(timed_calls)))


@pytest.mark.parametrize("one_turn", [False, True])
def test_a_parts_autotuning_choices_take_one_turn_alone_in_all(monkeypatch, one_turn):
    """Two shapes, two choices: one turn each in plain TUNE mode; one for both inside ``one_turn()`` (the speed
    recording of a part), since every turn pauses every other process on the GPU."""
    import torch

    from grader.speed import autotune

    add_one, counter = _autotuned_add_one(monkeypatch)
    x = torch.zeros(200)
    with autotune.one_turn() if one_turn else autotune.mode(autotune.TUNE):
        for n in (100, 200):
            add_one(x, n)
    assert counter.turns == (1 if one_turn else 2)
    assert torch.equal(x[:100], torch.full((100,), 2.0)) and torch.equal(x[100:], torch.ones(100))


def test_a_choice_one_of_a_students_workers_timed_is_taken_by_the_others_without_timing(monkeypatch, tmp_path):
    """Two workers of one student (two autotuners of one kernel, the student's Triton cache shared): the first
    times the candidates in a turn alone and leaves its choice in the cache; the second makes the same choice without
    a turn or a timing. Another key, a different list of candidates or a damaged record is timed again."""
    import torch
    import triton
    import triton.testing

    from grader.speed import autotune, autotune_choices

    _, counter = _autotuned_add_one(monkeypatch)
    timed: list[int] = []

    def time_interleaved(calls, **kw):  # the second candidate (BLOCK 32) is the faster
        timed.extend(range(len(timed), len(timed) + len(calls)))
        return [[2.0, 2.0, 2.0] if k % 2 == 0 else [1.0, 1.0, 1.0] for k in range(len(calls))]

    monkeypatch.setattr(autotune, "time_interleaved", time_interleaved)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a test GPU")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))

    def worker(configs=(16, 32)):  # a fresh autotuner: another process's
        kernel = _ADD_ONE_KERNEL[0]
        monkeypatch.setattr(kernel, "cache_key", "the kernel's source", raising=False)
        tuned = triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in configs], key=["n"])(kernel)
        return tuned

    first, second, third = worker(), worker(), worker((16, 32, 64))
    x = torch.zeros(100)
    with autotune.one_turn():
        first[(1,)](x, 100)
    assert (counter.turns, len(timed), first.best_config.kwargs) == (1, 2, {"BLOCK": 32})
    assert len(list((tmp_path / autotune_choices.SHARED_CHOICES).iterdir())) == 1
    with autotune.one_turn():
        second[(1,)](x, 100)
    assert (counter.turns, len(timed), second.best_config.kwargs) == (1, 2, {"BLOCK": 32})  # no turn, no timing
    with autotune.one_turn():
        second[(1,)](x, 64)  # another key
        third[(1,)](x, 100)  # other candidates
    assert (counter.turns, len(timed)) == (2, 7)
    for record in (tmp_path / autotune_choices.SHARED_CHOICES).iterdir():
        record.write_text('{"index": 7}')
    with autotune.one_turn():
        worker()[(1,)](x, 100)
    assert (counter.turns, len(timed)) == (3, 9)


def test_a_choice_whose_candidates_have_no_stable_name_is_not_shared():
    """A pre-hook that closes over anything but plain values (here a tensor) names its candidates differently in
    each process, or not at all: such a choice is timed by every worker, and nothing is left in the cache."""
    import torch
    import triton

    from grader.speed import autotune_choices

    tiles = {"q": "M"}
    weights = torch.ones(3)

    def by_tiles(nargs):
        return tiles

    def by_tensor(nargs):
        return weights

    assert autotune_choices.hook_name(by_tiles).endswith("by_tiles({'q': 'M'},)")
    assert autotune_choices.hook_name(by_tensor) is None
    assert autotune_choices.hook_name(None) == ""
    configs = [triton.Config({"BLOCK": b}, pre_hook=by_tensor) for b in (16, 32)]

    class Tuner:
        fn = types.SimpleNamespace(cache_key="source")
        nargs, arg_names, keys = {"n": 100}, ["x_ptr", "n"], ["n"]

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("TRITON_CACHE_DIR", "/nonexistent")
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a test GPU")
        assert autotune_choices.shared_choice(Tuner(), configs, {}) is None
        plain = [triton.Config({"BLOCK": b}, pre_hook=by_tiles) for b in (16, 32)]
        assert autotune_choices.shared_choice(Tuner(), plain, {}).parent.name == autotune_choices.SHARED_CHOICES


def test_autotuning_times_a_choices_candidates_together_whatever_the_students_benchmarker():
    """A choice's candidates are timed once, all together, by the grader's timing (brief and interleaved:
    tests/speed/test_autotune_timing.py), never by the benchmarker the student gave the autotuner."""
    import torch

    from grader.speed import autotune

    with pytest.MonkeyPatch.context() as monkeypatch:
        timings: list = []
        add_one, _ = _autotuned_add_one(monkeypatch, timings)
        monkeypatch.setitem(_ADD_ONE_TUNER[0].__dict__, "do_bench", lambda *a, **kw: pytest.fail("student's bench"))
        x = torch.zeros(100)
        with autotune.one_turn():
            add_one(x, 100)
        assert timings == [2]  # both configs, in one timing
        assert torch.equal(x, torch.ones(100))  # only the chosen config ran (the fake times without running)


def test_a_parts_autotuning_turn_ends_before_its_speed_is_recorded(monkeypatch):
    """The worker's speed request: the part's autotuning choices are made first, in one turn alone; the recording
    that follows shares the GPU and finds every choice made (no second turn)."""
    import torch

    from grader import exercises
    from grader.grading.isolation import protocol as p
    from grader.grading.isolation import worker
    from grader.speed import student_calls
    from grader.speed.measure import SpeedMeasurement

    class Turns(_TurnCounter):
        held = False

        @contextlib.contextmanager
        def alone(self):
            self.turns += 1
            self.held = True
            try:
                yield
            finally:
                self.held = False

    add_one, _ = _autotuned_add_one(monkeypatch)
    turns = Turns()
    monkeypatch.setattr(gpu_gate, "_current", turns)
    x = torch.zeros(100)
    monkeypatch.setattr(student_calls, "input_sets", lambda part, bench, sets, device: [{"x": x}])
    monkeypatch.setattr(student_calls, "student_call", lambda part, module: lambda inputs: add_one(inputs["x"], 100))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a: None)
    recorded = []

    def record_part(part, module, *, recheck_inputs):
        add_one(x, 100)
        recorded.append((turns.held, turns.turns))
        return SpeedMeasurement("fake GPU")

    monkeypatch.setattr(student_calls, "record_part", record_part)
    reply = worker._run(p.RunSpeed("r1", "forward", 1.0, None), exercises.get("gelu"), {"forward": None}, "cpu")
    assert isinstance(reply, p.SpeedDone)
    assert turns.turns == 1 and recorded == [(False, 1)]  # recorded after the turn, and no turn of its own


