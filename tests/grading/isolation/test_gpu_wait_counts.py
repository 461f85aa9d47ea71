"""What the sharing of a GPU counts (grader.grading.isolation.gpu_arbiter, grader.checks.gpu_gate), with threads
standing in for the processes, on a clock that moves only when a test says (tests/manual_clock.py): the time a
process waits for a turn or is paused counts as its wait, not its own time (its limits move on by as much), and
``grader grade --profile`` says how long turns were held, waited for each other, and held the others up."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from grader.grading.batch.profiling import held_up_text
from grader.grading.isolation.gpu_arbiter import GpuArbiter
from tests.gates import HANG_S, ThreadProcess, asked_turns, turn_held, until
from tests.manual_clock import ManualClock


def test_the_profile_says_whose_gpu_work_a_turn_waited_for_the_longest():
    """A turn waits for every other process's stretch under way; the last to pause is counted by its role (workers,
    timers, the grader's references) and what it was running, for ``--profile``."""
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    quick, slow = ThreadProcess(arbiter, "worker"), ThreadProcess(arbiter, "a timer", role="timer")
    quick.client.doing, slow.client.doing = "a case", "validating"  # as the grader says what each runs
    requester = ThreadProcess(arbiter, "requester")
    inside = threading.Barrier(3, timeout=HANG_S)
    end = {quick: threading.Event(), slow: threading.Event()}

    def stretch(process: ThreadProcess) -> None:
        with process.gate.use():
            inside.wait()
            end[process].wait(HANG_S)

    def turn() -> None:
        with requester.gate.alone():
            pass

    threads = [threading.Thread(target=stretch, args=(p,)) for p in (quick, slow)]
    for t in threads:
        t.start()
    inside.wait()
    asker = threading.Thread(target=turn)
    asker.start()
    until(lambda: clock.deadline_of(quick.client.drained) is not None, "the turn waits for the stretches")
    end[quick].set()
    until(quick.client.drained.is_set, "the quick one pauses")
    clock.advance(0.4)  # the slow one validates on
    end[slow].set()
    for t in [*threads, asker]:
        t.join(HANG_S)
    assert arbiter.held_up_by == {("timer", "validating"): [1, pytest.approx(0.4)]}
    assert arbiter.drain_s == pytest.approx(0.4)
    said = "trusted timers 0.4 s in 1 turn(s) (validating 0.4 s in 1)"
    assert held_up_text(arbiter.held_up_by) == said


def test_every_request_a_worker_runs_has_a_name_in_the_profile():
    """The supervisor tells the arbiter what each request has the worker run, by these names."""
    import typing

    from grader.grading.exercise_run.supervise import DOING
    from grader.grading.isolation import protocol

    runs = set(typing.get_args(protocol.Request)) - {protocol.Job, protocol.Finish}
    assert set(DOING) == runs and all(DOING.values())


def test_the_wait_for_a_turn_is_counted_as_the_processes_and_told_to_it():
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    told: list[str] = []

    class Watch:
        def pause(self):
            told.append("pause")

        def resume(self):
            told.append("resume")

    holder = ThreadProcess(arbiter, "holder")
    waiter = ThreadProcess(arbiter, "waiter")
    waiter.gate._watch = Watch()

    def use() -> None:
        with waiter.gate.use():  # paused: waits for the turn to end
            pass

    with turn_held(holder):
        u = threading.Thread(target=use)
        u.start()
        until(waiter.paused_and_waiting, "the waiter waits for the turn")
        clock.advance(0.6)
    u.join(HANG_S)
    assert waiter.client.waited_s == pytest.approx(0.6) and waiter.gate.paused_s == pytest.approx(0.6)
    assert told == ["pause", "resume"]


def test_the_profile_says_how_long_turns_waited_behind_each_other(monkeypatch):
    """A turn asked for while another runs waits for it: ``--profile`` counts that wait apart from the (shorter)
    wait for the others' GPU work before each turn."""
    from grader.grading.batch import profiling
    from grader.grading.exercise_run.slots import Slot

    monkeypatch.setattr(profiling, "gpu_references", SimpleNamespace(of=lambda arbiter: None))
    clock = ManualClock()
    slot = Slot("cuda:0", {"kind": "cuda", "name": "fake GPU", "index": 0}, arbiter=GpuArbiter(clock=clock))
    first, second = ThreadProcess(slot.arbiter, "first"), ThreadProcess(slot.arbiter, "second")

    def queued() -> None:
        with second.gate.alone():  # queued behind the first turn
            pass

    with turn_held(first):
        s = threading.Thread(target=queued)
        s.start()
        until(lambda: asked_turns(slot.arbiter) == 1, "the second turn is asked for")
        clock.advance(0.5)
    s.join(HANG_S)
    notes = []
    progress = SimpleNamespace(started=time.monotonic() - 5.0, done=2, note=notes.append)
    profiling.report(progress, [slot], submissions=1)
    line = next(x for x in notes[0].splitlines() if "held alone" in x)
    queued_s = float(line.split("for their turn (that wait included) ")[1].split(" s")[0])
    drained_s = float(line.split("before them ")[1].split(" s")[0])
    assert (queued_s, drained_s) == (0.5, 0.0), line
    held = float(line.split("the workers' autotuning ")[1].split(" s")[0])  # both turns were workers'
    assert held == 0.5 and "the trusted timers' rounds" not in line, line


def test_the_time_a_process_waits_to_use_the_gpu_during_a_turn_is_counted_and_a_compiling_ones_is_not():
    """``--profile`` says how much of the processes' work the turns held up: a process paused while it waits to use
    the GPU counts from the moment it asks until the turn is over; one paused while it compiles counts nothing."""
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    waiting, compiling = ThreadProcess(arbiter, "waiting"), ThreadProcess(arbiter, "compiling")
    timer = ThreadProcess(arbiter, "timer", role="timer")
    in_compiler, done = threading.Event(), threading.Event()

    def compile_then_wait() -> None:
        with compiling.gate.use(), compiling.gate.released():
            in_compiler.set()
            done.wait(HANG_S)  # compiling through the whole turn: it never asks for the GPU meanwhile

    def use() -> None:
        with waiting.gate.use():  # held up until the turn is over
            pass

    c = threading.Thread(target=compile_then_wait)
    c.start()
    assert in_compiler.wait(HANG_S)
    with turn_held(timer):
        clock.advance(0.2)
        u = threading.Thread(target=use)
        u.start()
        until(waiting.paused_and_waiting, "the waiting process asks to use the GPU")
        clock.advance(0.4)
    u.join(HANG_S)
    done.set()
    c.join(HANG_S)
    assert waiting.client.blocked_s == pytest.approx(0.4)  # from its asking to the end of the turn
    assert waiting.client.waited_s == pytest.approx(0.6)  # paused the whole turn
    assert compiling.client.blocked_s == 0.0 and compiling.client.waited_s == pytest.approx(0.6)  # not held up
    assert arbiter.blocked_by_role == {"worker": pytest.approx(0.4)}
    assert arbiter.alone_by_role == {"timer": pytest.approx(0.6)}


def test_the_profile_says_how_long_processes_waited_to_use_the_gpu_during_turns():
    from grader.grading.batch.profiling import blocked_text

    assert blocked_text({"timer": 0.5, "worker": 3.25}) == (
        "waiting to use the GPU while it was held alone (held up, not compiling): workers 3.2 s, trusted timers 0.5 s")
