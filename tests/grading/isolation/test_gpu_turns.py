"""Turns alone on a shared GPU (grader.grading.isolation.gpu_arbiter), with threads standing in for the processes,
on a clock that moves only when a test says (tests/manual_clock.py): turns come first come, first served; a process
started during a turn starts paused; the others continue between two turns, also when the second was asked for
during the first; the next turn waits for the GPU work of the process whose turn ended; a process may take two
turns in a row. Each test checks the order of what happened (and the bytes the arbiter sent), never how long it took."""

from __future__ import annotations

import threading

from grader.grading.isolation.gpu_arbiter import GpuArbiter
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
    # the turns in the order asked for; the late process continues after the first, before or after the second
    assert [event for event in order if event != "late uses the GPU"] == ["first", "first end", "second", "second end"]
    assert order.index("late uses the GPU") > order.index("first end")
    assert late.client.waited_s >= 0.5  # paused for the first turn at least


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


def test_the_others_continue_between_two_turns_that_come_together(monkeypatch):
    """The second turn was asked for during the first: the others are let go when the first ends and paused again
    for the second (turns are never chained with the others kept paused: docs/decisions/0012)."""
    sent = _bytes_sent(monkeypatch)
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    worker = ThreadProcess(arbiter, "worker")
    order = _two_turns(clock, arbiter, ThreadProcess(arbiter, "first"), ThreadProcess(arbiter, "second"),
                       hold_s=0.5)
    with worker.gate.use():  # once both turns are over
        order.append("worker")
    assert order == ["first", "first end", "second", "second end", "worker"]
    assert [b for name, b in sent if name == "worker"] == [b"C", b"P", b"C", b"P", b"C"]
    assert [b for name, b in sent if name == "second"] == [b"C", b"P", b"C", b"G"]  # let go, then granted its turn
    assert arbiter.alone_count == 2


def test_the_process_whose_turn_ended_finishes_its_gpu_work_before_the_next_turn():
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


def test_a_process_may_take_two_turns_in_a_row():
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    process = ThreadProcess(arbiter, "process")
    ThreadProcess(arbiter, "worker")
    order = _two_turns(clock, arbiter, process, process, hold_s=0.2)
    assert order == ["first", "first end", "second", "second end"]
    until(lambda: arbiter.alone_count == 2, "the arbiter counts two turns")  # counted once the second is over
