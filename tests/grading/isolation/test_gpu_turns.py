"""Turns alone on a shared GPU (grader.grading.isolation.gpu_arbiter), with threads standing in for the processes,
on a clock that moves only when a test says (tests/manual_clock.py): turns come first come, first served; a process
started during a turn starts paused; a turn asked for during another follows it with the others still paused, for
at most ``MAX_CHAIN_S``, once the process whose turn ended has finished its GPU work; a process may take two turns
in a row. Each test checks the order of what happened (and the bytes the arbiter sent), never how long it took."""

from __future__ import annotations

import threading

import pytest

from grader.grading.isolation.gpu_arbiter import MAX_CHAIN_S, GpuArbiter
from tests.gates import HANG_S, ThreadProcess, asked_turns, drain_waits_for, until
from tests.manual_clock import ManualClock


def test_turns_come_in_order_and_a_process_started_during_a_turn_starts_paused():
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    first, second = ThreadProcess(arbiter, "first"), ThreadProcess(arbiter, "second")
    order, in_turn, end_first = [], threading.Event(), threading.Event()

    def first_turn() -> None:
        with first.gate.alone():
            order.append("first")
            in_turn.set()
            end_first.wait(HANG_S)
            order.append("first end")

    def second_turn() -> None:
        with second.gate.alone():
            order.append("second")
            clock.advance(0.1)
            order.append("second end")

    a = threading.Thread(target=first_turn)
    a.start()
    assert in_turn.wait(HANG_S)
    b = threading.Thread(target=second_turn)
    b.start()
    until(lambda: asked_turns(arbiter) == 1, "the second turn is asked for")
    late = ThreadProcess(arbiter, "late")  # connects while the first turn runs

    def late_use() -> None:
        with late.gate.use():
            order.append("late uses the GPU")

    c = threading.Thread(target=late_use)
    c.start()
    until(late.paused_and_waiting, "the late process waits: it started paused")
    clock.advance(0.5)
    end_first.set()
    for t in (a, b, c):
        t.join(HANG_S)
    # the second turn follows the first at once; the late process continues once both are over
    assert order == ["first", "first end", "second", "second end", "late uses the GPU"]
    assert late.client.waited_s == pytest.approx(0.6)


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


def _two_turns(clock: ManualClock, arbiter: GpuArbiter, first: ThreadProcess, second: ThreadProcess, *,
               hold_s: float, request=None) -> list[str]:
    """``first`` takes a turn; ``second`` asks for one meanwhile, and the first turn ends ``hold_s`` later on the
    clock. ``request(turn, order)``, where given, is what the first process's thread runs around its turn
    (``turn()``). What happened, in order."""
    order, granted = [], threading.Event()

    def turn() -> None:
        with first.gate.alone():
            order.append("first")
            granted.set()
            until(lambda: asked_turns(arbiter) == 1, "the second turn is asked for")
            clock.advance(hold_s)
            order.append("first end")

    t = threading.Thread(target=turn if request is None else lambda: request(turn, order))
    t.start()
    assert granted.wait(HANG_S)
    with second.gate.alone():
        order.append("second")
        clock.advance(0.05)
        order.append("second end")
    t.join(HANG_S)
    return order


def test_a_turn_asked_for_during_another_follows_it_with_the_others_still_paused(monkeypatch):
    """The others are paused once for two turns that come together, not paused, let go and paused again: each pause
    waits for their GPU work in flight."""
    sent = _bytes_sent(monkeypatch)
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    worker = ThreadProcess(arbiter, "worker")
    order = _two_turns(clock, arbiter, ThreadProcess(arbiter, "first"), ThreadProcess(arbiter, "second"),
                       hold_s=MAX_CHAIN_S - 0.5)
    with worker.gate.use():  # the worker continues after both turns
        order.append("worker")
    assert order == ["first", "first end", "second", "second end", "worker"]
    assert [b for name, b in sent if name == "worker"] == [b"C", b"P", b"C"]
    assert [b for name, b in sent if name == "second"] == [b"C", b"P", b"C", b"G"]  # let go just before its turn
    assert arbiter.chained == 1 and arbiter.alone_count == 2


def test_a_chain_of_turns_lasts_at_most_max_chain_s_then_the_others_continue(monkeypatch):
    sent = _bytes_sent(monkeypatch)
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    worker = ThreadProcess(arbiter, "worker")
    order = _two_turns(clock, arbiter, ThreadProcess(arbiter, "first"), ThreadProcess(arbiter, "second"),
                       hold_s=MAX_CHAIN_S + 0.5)
    with worker.gate.use():  # once both turns are over
        pass
    assert order == ["first", "first end", "second", "second end"]
    assert [b for name, b in sent if name == "worker"] == [b"C", b"P", b"C", b"P", b"C"]
    assert arbiter.chained == 0 and arbiter.alone_count == 2


def test_the_process_whose_turn_ended_finishes_its_gpu_work_before_the_next_turn_of_a_chain():
    """After its turn a process goes on sharing the GPU in the same stretch (a worker's speed request records after
    its autotuning): the next turn waits for that work, and the process's next stretch waits for the turn."""
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    first = ThreadProcess(arbiter, "first")

    def request(turn, order: list[str]) -> None:
        with first.gate.use():
            turn()
            order.append("first shares")
            drain_waits_for(clock, first)
            order.append("first shares end")
        with first.gate.use():
            order.append("first again")

    order = _two_turns(clock, arbiter, first, ThreadProcess(arbiter, "second"), hold_s=0.2, request=request)
    assert order == ["first", "first end", "first shares", "first shares end", "second", "second end", "first again"]
    assert arbiter.chained == 1


def test_a_process_may_take_two_turns_in_a_row():
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    process = ThreadProcess(arbiter, "process")
    ThreadProcess(arbiter, "worker")
    order = _two_turns(clock, arbiter, process, process, hold_s=0.2)
    assert order == ["first", "first end", "second", "second end"]
    assert arbiter.chained == 1
