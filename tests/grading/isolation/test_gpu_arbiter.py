"""Sharing a GPU (grader.checks.gpu_gate, grader.grading.isolation.gpu_arbiter), on the CPU, with threads standing
in for the processes: they use the GPU side by side; a turn alone pauses the others once their GPU work is done, never
waits for a compilation, and never for a process that is gone; turns come first come, first served; a process
started during a turn starts paused; the time a process waits is counted (its limits move on by as much); and an
autotuner timing its configs has the GPU alone once per choice."""

from __future__ import annotations

import _thread
import contextlib
import os
import threading
import time
import types

import pytest

from grader.checks import gpu_gate
from grader.grading.batch.profiling import held_up_text
from grader.grading.isolation.gpu_arbiter import GpuArbiter
from tests.gates import ThreadProcess


class _Board:
    """Who is inside a use() stretch or a turn alone, and what each saw."""

    def __init__(self):
        self.lock = threading.Lock()
        self.using: set[str] = set()
        self.alone: set[str] = set()
        self.events: list[tuple[str, str, frozenset[str]]] = []

    def enter(self, kind: str, name: str) -> None:
        with self.lock:
            (self.alone if kind == "alone" else self.using).add(name)
            self.events.append((name, kind, frozenset(self.using | self.alone)))

    def leave(self, kind: str, name: str) -> None:
        with self.lock:
            (self.alone if kind == "alone" else self.using).discard(name)


def test_processes_share_the_gpu_and_a_turn_alone_waits_for_their_work_then_pauses_them():
    arbiter, board = GpuArbiter(), _Board()
    users = [ThreadProcess(arbiter, f"w{i}") for i in range(3)]
    timer = ThreadProcess(arbiter, "timer")
    inside = threading.Barrier(4, timeout=10)
    turn_asked, leave = threading.Event(), threading.Event()

    def work(name: str, process: ThreadProcess) -> None:
        with process.gate.use():
            board.enter("use", name)
            inside.wait()  # all three use the GPU at once
            leave.wait(10)
            board.leave("use", name)
        with process.gate.use():  # after the turn was asked for: waits for it to end
            board.enter("use", name)
            board.leave("use", name)

    def alone() -> None:
        with timer.gate.use():
            turn_asked.set()
            with timer.gate.alone():
                board.enter("alone", "timer")
                time.sleep(0.2)
                board.leave("alone", "timer")

    threads = [threading.Thread(target=work, args=(f"w{i}", p)) for i, p in enumerate(users)]
    for t in threads:
        t.start()
    inside.wait()
    t_alone = threading.Thread(target=alone)
    t_alone.start()
    turn_asked.wait(10)
    time.sleep(0.3)
    assert "timer" not in board.alone  # the others' GPU work is not done: the turn waits for it
    leave.set()
    for t in [*threads, t_alone]:
        t.join(10)
    assert [e for e in board.events if e[1] == "alone"] == [("timer", "alone", frozenset({"timer"}))]
    uses = [e for e in board.events if e[1] == "use"]
    assert max(len(seen) for _, _, seen in uses) == 3  # shared
    assert all("timer" not in seen for _, _, seen in uses)  # nobody used the GPU during the turn
    assert arbiter.alone_count == 1 and arbiter.alone_s >= 0.2


def test_the_profile_says_whose_gpu_work_a_turn_waited_for_the_longest():
    """A turn waits for every other process's stretch under way; the last to pause is counted by its role (workers,
    timers, the grader's references) and what it was running, for ``--profile``."""
    arbiter = GpuArbiter()
    quick, slow = ThreadProcess(arbiter, "worker"), ThreadProcess(arbiter, "a timer", role="timer")
    quick.client.doing, slow.client.doing = "a case", "validating"  # as the grader says what each runs
    requester = ThreadProcess(arbiter, "requester")
    inside, go = threading.Barrier(3, timeout=10), threading.Event()

    def stretch(process: ThreadProcess, seconds: float) -> None:
        with process.gate.use():
            inside.wait()
            go.wait(10)
            time.sleep(seconds)

    threads = [threading.Thread(target=stretch, args=(quick, 0.0)), threading.Thread(target=stretch, args=(slow, 0.4))]
    for t in threads:
        t.start()
    inside.wait()
    go.set()
    with requester.gate.alone():
        pass
    for t in threads:
        t.join(10)
    assert list(arbiter.held_up_by) == [("timer", "validating")]
    turns, seconds = arbiter.held_up_by["timer", "validating"]
    assert turns == 1 and 0.3 < seconds <= arbiter.drain_s + 1e-6
    said = f"trusted timers {seconds:.1f} s in 1 turn(s) (validating {seconds:.1f} s in 1)"
    assert held_up_text(arbiter.held_up_by) == said


def test_every_request_a_worker_runs_has_a_name_in_the_profile():
    """The supervisor tells the arbiter what each request has the worker run, by these names."""
    import typing

    from grader.grading.exercise_run.supervise import DOING
    from grader.grading.isolation import protocol

    runs = set(typing.get_args(protocol.Request)) - {protocol.Job, protocol.Finish}
    assert set(DOING) == runs and all(DOING.values())


def _turn_while_compiling(timer: ThreadProcess, call, compiling: threading.Event, order: list[str]) -> float:
    """Run ``call`` (another process's) on a thread; once its compilation (a second of it) has begun, take a turn
    alone for 1.2 s; how long the turn waited to be granted (``call`` has ended when this returns)."""
    t = threading.Thread(target=call)
    t.start()
    compiling.wait(10)
    started = time.monotonic()
    with timer.gate.use(), timer.gate.alone():
        granted_after = time.monotonic() - started
        order.append("timed rounds")
        time.sleep(1.2)  # the compilation ends meanwhile: the launch after it waits for the turn
        order.append("timed rounds end")
    t.join(10)
    return granted_after


def test_a_compiling_process_never_holds_up_a_turn_and_continues_after_it():
    arbiter = GpuArbiter()
    worker, timer = ThreadProcess(arbiter, "worker"), ThreadProcess(arbiter, "timer")
    compiling, order = threading.Event(), []

    def student_call():
        with worker.gate.use():
            order.append("launch")
            with worker.gate.released():  # Triton compiling the next kernel: CPU work
                compiling.set()
                time.sleep(1.0)
            order.append("next launch")

    granted_after = _turn_while_compiling(timer, student_call, compiling, order)
    assert granted_after < 0.5, granted_after
    assert order == ["launch", "timed rounds", "timed rounds end", "next launch"]
    assert worker.client.waited_s > 0.05  # paused after its compilation: not the student's time


def test_a_compilation_on_a_thread_the_stretch_waits_for_never_holds_up_a_turn():
    # PyTorch runs a CUDA backward pass on a thread of its own while the calling thread waits inside use(); Triton
    # compiles the backward's kernels on that thread
    arbiter = GpuArbiter()
    worker, timer = ThreadProcess(arbiter, "worker"), ThreadProcess(arbiter, "timer")
    compiling, order = threading.Event(), []

    def backward_thread():
        with worker.gate.released():  # compiling the backward's kernel: CPU work
            compiling.set()
            time.sleep(1.0)
        with worker.gate.released():  # a second compilation, after the turn: nothing to give back twice
            pass
        order.append("backward launch")

    def student_call():
        with worker.gate.use():
            order.append("forward launch")
            ended = threading.Event()

            def engine():  # a thread Python's threading did not start, as PyTorch's engine's
                try:
                    backward_thread()
                finally:
                    ended.set()

            _thread.start_new_thread(engine, ())
            ended.wait(10)  # the calling thread waits for the backward pass
            order.append("after backward")

    granted_after = _turn_while_compiling(timer, student_call, compiling, order)
    assert granted_after < 0.5, granted_after
    assert order == ["forward launch", "timed rounds", "timed rounds end", "backward launch", "after backward"]
    with timer.gate.use(), timer.gate.alone():  # the stretch was given back whole and has ended: nothing in use
        pass
    assert worker.gate._users == 0


def test_a_compiling_thread_python_started_lends_nothing_and_a_turn_waits_for_the_stretch():
    # the grader's compiling threads: the thread inside use() may go on with GPU work meanwhile
    arbiter = GpuArbiter()
    worker, timer = ThreadProcess(arbiter, "worker"), ThreadProcess(arbiter, "timer")
    compiling, stretch_ended, order = threading.Event(), threading.Event(), []

    def compile_thread():
        with worker.gate.released():
            compiling.set()
            time.sleep(0.6)

    def stretch():
        with worker.gate.use():
            pool = threading.Thread(target=compile_thread)
            pool.start()
            pool.join(10)
            order.append("stretch ends")
        stretch_ended.set()

    t = threading.Thread(target=stretch)
    t.start()
    compiling.wait(10)
    with timer.gate.use(), timer.gate.alone():
        order.append("timed rounds")
    t.join(10)
    assert order == ["stretch ends", "timed rounds"]
    assert worker.gate._users == 0


def test_lending_threads_and_a_releasing_caller_never_hold_up_a_turn():
    # the engine's thread lends the stretch, then the calling thread releases it too (in either order): the count
    # goes below zero for a while, and a turn asked for meanwhile is granted at once
    arbiter = GpuArbiter()
    worker, timer = ThreadProcess(arbiter, "worker"), ThreadProcess(arbiter, "timer")
    lent, go_on, ended = threading.Event(), threading.Event(), threading.Event()

    def engine():
        try:
            with worker.gate.released():
                lent.set()
                go_on.wait(10)
        finally:
            ended.set()

    def caller():
        with worker.gate.use():
            _thread.start_new_thread(engine, ())
            lent.wait(10)
            with worker.gate.released():
                go_on.wait(10)
                ended.wait(10)

    def turn():
        with timer.gate.use(), timer.gate.alone():
            granted.set()
            go_on.set()

    granted = threading.Event()
    t = threading.Thread(target=caller, daemon=True)
    t.start()
    lent.wait(10)
    time.sleep(0.1)
    threading.Thread(target=turn, daemon=True).start()
    assert granted.wait(2), "a turn waited for a stretch nobody used"
    t.join(10)
    with timer.gate.use(), timer.gate.alone():
        pass
    assert worker.gate._users == 0


def test_a_process_that_is_gone_never_blocks_a_turn():
    arbiter = GpuArbiter()
    stuck, timer = ThreadProcess(arbiter, "stuck"), ThreadProcess(arbiter, "timer")
    holding = threading.Event()

    def hold_forever():
        with stuck.gate.use():
            holding.set()
            time.sleep(30)

    threading.Thread(target=hold_forever, daemon=True).start()
    holding.wait(10)
    granted = threading.Event()

    def ask():
        with timer.gate.alone():
            granted.set()

    threading.Thread(target=ask, daemon=True).start()
    assert not granted.wait(0.5)  # it still runs: the turn waits
    stuck.die()  # killed (say, its call limit): it is paused for good
    assert granted.wait(5)


def test_turns_come_in_order_and_a_process_started_during_a_turn_starts_paused():
    arbiter = GpuArbiter()
    first, second = ThreadProcess(arbiter, "first"), ThreadProcess(arbiter, "second")
    order, in_turn = [], threading.Event()

    def turn(process: ThreadProcess, name: str, hold: float) -> None:
        with process.gate.alone():
            order.append(name)
            in_turn.set()
            time.sleep(hold)
            order.append(f"{name} end")

    a = threading.Thread(target=turn, args=(first, "first", 0.5))
    a.start()
    in_turn.wait(10)
    b = threading.Thread(target=turn, args=(second, "second", 0.1))
    b.start()
    late = ThreadProcess(arbiter, "late")  # connects while the first turn runs
    with late.gate.use():
        order.append("late uses the GPU")
    a.join(10)
    b.join(10)
    assert order[:2] == ["first", "first end"]
    assert set(order[2:]) == {"second", "second end", "late uses the GPU"}
    assert order.index("second") < order.index("second end")
    assert late.client.waited_s > 0.1


def test_the_wait_for_a_turn_is_counted_as_the_processes_and_told_to_it():
    arbiter = GpuArbiter()
    told: list[str] = []

    class Watch:
        def pause(self):
            told.append("pause")

        def resume(self):
            told.append("resume")

    holder = ThreadProcess(arbiter, "holder")
    waiter = ThreadProcess(arbiter, "waiter")
    waiter.gate._watch = Watch()
    granted = threading.Event()

    def hold():
        with holder.gate.alone():
            granted.set()
            time.sleep(0.6)

    t = threading.Thread(target=hold)
    t.start()
    granted.wait(10)
    with waiter.gate.use():  # paused: waits for the turn to end
        pass
    t.join(10)
    assert 0.3 < waiter.client.waited_s < 5
    assert told == ["pause", "resume"]


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


def test_the_profile_says_how_long_turns_waited_behind_each_other(monkeypatch):
    """A turn asked for while another runs waits for it: ``--profile`` counts that wait apart from the (shorter)
    wait for the others' GPU work before each turn."""
    from types import SimpleNamespace

    from grader.grading.batch import profiling
    from grader.grading.exercise_run.slots import Slot

    monkeypatch.setattr(profiling, "gpu_references", SimpleNamespace(of=lambda arbiter: None))
    slot = Slot("cuda:0", {"kind": "cuda", "name": "fake GPU", "index": 0})
    first, second = ThreadProcess(slot.arbiter, "first"), ThreadProcess(slot.arbiter, "second")
    granted = threading.Event()

    def hold() -> None:
        with first.gate.alone():
            granted.set()
            time.sleep(0.5)

    t = threading.Thread(target=hold)
    t.start()
    assert granted.wait(10)
    with second.gate.alone():  # queued behind the first turn
        pass
    t.join(10)
    notes = []
    progress = SimpleNamespace(started=time.monotonic() - 5.0, done=2, note=notes.append)
    profiling.report(progress, [slot], submissions=1)
    line = next(x for x in notes[0].splitlines() if "held alone" in x)
    queued = float(line.split("for their turn (that wait included) ")[1].split(" s")[0])
    drained = float(line.split("before them ")[1].split(" s")[0])
    assert queued >= 0.4 and drained < 0.3, line
    held = float(line.split("the workers' autotuning ")[1].split(" s")[0])  # both turns were workers'
    assert held >= 0.5 and "the trusted timers' rounds" not in line, line


def _bytes_sent(monkeypatch) -> list[tuple[str, bytes]]:
    """(process, byte) for every byte the arbiter sends, in order."""
    from grader.grading.isolation.gpu_arbiter import Client

    sent: list[tuple[str, bytes]] = []
    original = Client._sent

    def record(self, byte: bytes) -> None:
        sent.append((self.name, byte))
        original(self, byte)

    monkeypatch.setattr(Client, "_sent", record)
    return sent


def _two_turns(arbiter: GpuArbiter, first: ThreadProcess, second: ThreadProcess, *, hold_s: float,
               request=None) -> list[str]:
    """``first`` takes a turn and holds it ``hold_s``; ``second`` asks for one meanwhile. ``request(turn, order)``,
    where given, is what the first process's thread runs around its turn (``turn()``). What happened, in order."""
    order, granted = [], threading.Event()

    def turn() -> None:
        with first.gate.alone():
            order.append("first")
            granted.set()
            time.sleep(hold_s)
            order.append("first end")

    t = threading.Thread(target=turn if request is None else lambda: request(turn, order))
    t.start()
    assert granted.wait(10)
    with second.gate.alone():
        order.append("second")
        time.sleep(0.05)
        order.append("second end")
    t.join(10)
    return order


def test_a_turn_asked_for_during_another_follows_it_with_the_others_still_paused(monkeypatch):
    """The others are paused once for two turns that come together, not paused, let go and paused again: each pause
    waits for their GPU work in flight."""
    sent = _bytes_sent(monkeypatch)
    arbiter = GpuArbiter()
    worker = ThreadProcess(arbiter, "worker")
    order = _two_turns(arbiter, ThreadProcess(arbiter, "first"), ThreadProcess(arbiter, "second"), hold_s=0.3)
    with worker.gate.use():  # the worker continues after both turns
        order.append("worker")
    assert order == ["first", "first end", "second", "second end", "worker"]
    assert [b for name, b in sent if name == "worker"] == [b"C", b"P", b"C"]
    assert [b for name, b in sent if name == "second"] == [b"C", b"P", b"C", b"G"]  # let go just before its turn
    assert arbiter.chained == 1 and arbiter.alone_count == 2


def test_a_chain_of_turns_lasts_at_most_max_chain_s_then_the_others_continue(monkeypatch):
    from grader.grading.isolation import gpu_arbiter

    monkeypatch.setattr(gpu_arbiter, "MAX_CHAIN_S", 0.1)
    sent = _bytes_sent(monkeypatch)
    arbiter = GpuArbiter()
    worker = ThreadProcess(arbiter, "worker")
    order = _two_turns(arbiter, ThreadProcess(arbiter, "first"), ThreadProcess(arbiter, "second"), hold_s=0.3)
    with worker.gate.use():  # once both turns are over
        pass
    assert order == ["first", "first end", "second", "second end"]
    assert [b for name, b in sent if name == "worker"] == [b"C", b"P", b"C", b"P", b"C"]
    assert arbiter.chained == 0 and arbiter.alone_count == 2


def test_the_process_whose_turn_ended_finishes_its_gpu_work_before_the_next_turn_of_a_chain():
    """After its turn a process goes on sharing the GPU in the same stretch (a worker's speed request records after
    its autotuning): the next turn waits for that work, and the process's next stretch waits for the turn."""
    arbiter = GpuArbiter()
    first = ThreadProcess(arbiter, "first")

    def request(turn, order: list[str]) -> None:
        with first.gate.use():
            turn()
            order.append("first shares")
            time.sleep(0.3)
            order.append("first shares end")
        with first.gate.use():
            order.append("first again")

    order = _two_turns(arbiter, first, ThreadProcess(arbiter, "second"), hold_s=0.2, request=request)
    assert order == ["first", "first end", "first shares", "first shares end", "second", "second end", "first again"]
    assert arbiter.chained == 1


def test_the_time_a_process_waits_to_use_the_gpu_during_a_turn_is_counted_and_a_compiling_ones_is_not():
    """``--profile`` says how much of the processes' work the turns held up: a process paused while it waits to use
    the GPU counts from the moment it asks until the turn is over; one paused while it compiles counts nothing."""
    arbiter = GpuArbiter()
    waiting, compiling = ThreadProcess(arbiter, "waiting"), ThreadProcess(arbiter, "compiling")
    timer = ThreadProcess(arbiter, "timer", role="timer")
    granted, done = threading.Event(), threading.Event()

    def hold() -> None:
        with timer.gate.alone():
            granted.set()
            time.sleep(0.6)

    def compile_then_wait() -> None:
        with compiling.gate.use(), compiling.gate.released():
            done.wait(10)  # compiling through the whole turn: it never asks for the GPU meanwhile

    t = threading.Thread(target=hold)
    c = threading.Thread(target=compile_then_wait)
    c.start()
    t.start()
    assert granted.wait(10)
    time.sleep(0.2)
    asked = time.monotonic()
    with waiting.gate.use():  # held up until the turn is over
        held_up = time.monotonic() - asked
    t.join(10)
    done.set()
    c.join(10)
    assert held_up > 0.2
    assert abs(waiting.client.blocked_s - held_up) < 0.15, (waiting.client.blocked_s, held_up)
    assert compiling.client.blocked_s == 0.0 and compiling.client.waited_s > 0.5  # paused, not held up
    assert arbiter.blocked_by_role == {"worker": waiting.client.blocked_s}
    assert arbiter.alone_by_role["timer"] >= 0.6


def test_a_paused_process_says_once_per_pause_that_it_waits_to_use_the_gpu():
    """The process's side, on bare pipes: "W" once per pause however many of its threads wait, and again in the
    next pause; none while it may use the GPU."""
    to_gate_r, to_gate_w = os.pipe()
    from_gate_r, from_gate_w = os.pipe()
    os.write(to_gate_w, b"C")
    gate = gpu_gate.Gate(to_gate_r, from_gate_w)
    os.set_blocking(from_gate_r, False)

    def said() -> bytes:
        time.sleep(0.2)
        try:
            return os.read(from_gate_r, 100)
        except BlockingIOError:
            return b""

    def use_the_gpu() -> None:
        with gate.use():
            pass

    try:
        use_the_gpu()
        assert said() == b""
        for _ in range(2):  # two pauses
            os.write(to_gate_w, b"P")
            assert said() == b"D"
            threads = [threading.Thread(target=use_the_gpu) for _ in range(3)]
            for t in threads:
                t.start()
            assert said() == b"W"
            assert all(t.is_alive() for t in threads)  # paused: they wait
            os.write(to_gate_w, b"C")
            for t in threads:
                t.join(10)
            assert said() == b""
    finally:
        os.close(to_gate_w)  # the arbiter gone: the gate's listener ends
        gate.listener.join(5)
        for fd in (to_gate_r, from_gate_r, from_gate_w):
            os.close(fd)


def test_a_process_may_take_two_turns_in_a_row():
    arbiter = GpuArbiter()
    process = ThreadProcess(arbiter, "process")
    ThreadProcess(arbiter, "worker")
    order = _two_turns(arbiter, process, process, hold_s=0.2)
    assert order == ["first", "first end", "second", "second end"]
    assert arbiter.chained == 1


def test_a_turn_hurries_the_process_whose_gpu_work_it_waits_for_and_only_until_it_has_paused():
    """A worker running at a CPU niceness is told to hurry (the grader renices it to 0) while a turn waits for its
    stretch of GPU work, and to slow down again once it has paused; one with nothing in flight is not told."""
    arbiter = GpuArbiter()
    busy, idle = ThreadProcess(arbiter, "busy"), ThreadProcess(arbiter, "idle")
    told: list[tuple[str, bool, bool]] = []  # (who, on, was the stretch still running)
    inside, running = threading.Event(), threading.Event()
    busy.client.hurry = lambda on: told.append(("busy", on, running.is_set()))
    idle.client.hurry = lambda on: told.append(("idle", on, False))

    def stretch() -> None:
        with busy.gate.use():
            running.set()
            inside.set()
            time.sleep(0.3)
            running.clear()

    t = threading.Thread(target=stretch)
    t.start()
    inside.wait(10)
    time.sleep(0.05)  # the idle one has answered no pause yet: it is asked with the busy one
    with ThreadProcess(arbiter, "timer").gate.alone():
        pass
    t.join(10)
    assert told == [("busy", True, True), ("busy", False, False)]


def test_a_worker_at_a_niceness_is_reniced_while_a_turn_waits_for_it(tmp_path):
    """The grader's side of hurrying: every thread of the process and of its children gets the niceness."""
    import os
    import sys

    from grader.grading.isolation import processes, proctree

    if os.geteuid() != 0:
        pytest.skip("lowering a niceness needs root (the grader then leaves it as it is)")
    script = ("import os, subprocess, sys, threading, time; os.nice(7); "
              "threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
              "print('ready', flush=True); time.sleep(30)")
    process = processes.Process([sys.executable, "-c", script], cwd=str(tmp_path), env=dict(os.environ),
                                rss_limit_bytes=None, output_cap=1 << 16)
    try:
        deadline = time.monotonic() + 20
        while b"ready" not in b"".join(process.readers[0].chunks) and time.monotonic() < deadline:
            time.sleep(0.05)
        def niceness() -> set[int]:
            return {os.getpriority(os.PRIO_PROCESS, int(task)) for pid in proctree.descendants(process.pid)
                    for task in os.listdir(f"/proc/{pid}/task")}

        assert niceness() == {7}
        process.set_niceness(0)
        assert niceness() == {0}
        process.set_niceness(7)
        assert niceness() == {7}
    finally:
        process.stop()


def test_the_profile_says_how_long_processes_waited_to_use_the_gpu_during_turns():
    from grader.grading.batch.profiling import blocked_text

    assert blocked_text({"timer": 0.5, "worker": 3.25}) == (
        "waiting to use the GPU while it was held alone (held up, not compiling): workers 3.2 s, trusted timers 0.5 s")


def test_a_worker_that_fails_to_start_leaves_no_connection_a_turn_would_wait_for(tmp_path):
    """A worker whose construction fails after it connected to the GPU's arbiter (its scratch folder gone, say) would
    never answer a pause: every later turn alone waited for it, and a whole batch stalled. It is disconnected."""
    from grader.grading.config import RunSettings
    from grader.grading.exercise_run import workers

    arbiter = GpuArbiter()
    settings = RunSettings(device="cpu", secret="s", random_cases=0, timeout_s=10, call_timeout_s=5, memory_mb=None,
                           speed_budget_s=1, workdir=tmp_path)
    with pytest.raises(FileNotFoundError):
        workers.Worker(settings, tmp_path, tmp_path / "no such scratch", None, {}, arbiter)
    assert arbiter._clients == []  # nothing a drain waits for
    granted = []
    with arbiter.alone():  # granted: no client to pause
        granted.append(True)
    assert granted == [True]
