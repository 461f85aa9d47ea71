"""Sharing a GPU (grader.checks.gpu_gate, grader.grading.isolation.gpu_arbiter), on the CPU, with threads standing
in for the processes: they use the GPU side by side; a turn alone pauses the others once their GPU work is done, never
waits for a compilation, and never for a process that is gone; a paused process says once per pause that it waits;
a process a turn waits for is hurried. The arbiter runs on a clock that moves only when a test says
(tests/manual_clock.py): each test checks the order of what happened, never how long the machine took. The order
of turns: test_gpu_turns.py beside this file; what the waits count: test_gpu_wait_counts.py."""

from __future__ import annotations

import _thread
import os
import select
import threading

import pytest

from grader.checks import gpu_gate
from grader.grading.isolation.gpu_arbiter import GpuArbiter
from tests.gates import HANG_S, ThreadProcess, drain_waits_for, until, waiting_in
from tests.manual_clock import ManualClock


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
    clock = ManualClock()
    arbiter, board = GpuArbiter(clock=clock), _Board()
    users = [ThreadProcess(arbiter, f"w{i}") for i in range(3)]
    timer = ThreadProcess(arbiter, "timer")
    inside = threading.Barrier(4, timeout=HANG_S)
    leave = threading.Event()

    def work(name: str, process: ThreadProcess) -> None:
        with process.gate.use():
            board.enter("use", name)
            inside.wait()  # all three use the GPU at once
            leave.wait(HANG_S)
            board.leave("use", name)
        with process.gate.use():  # after the turn was asked for: waits for it to end
            board.enter("use", name)
            board.leave("use", name)

    def alone() -> None:
        with timer.gate.use(), timer.gate.alone():
            board.enter("alone", "timer")
            clock.advance(0.2)  # the timed rounds
            board.leave("alone", "timer")

    threads = [threading.Thread(target=work, args=(f"w{i}", p)) for i, p in enumerate(users)]
    for t in threads:
        t.start()
    inside.wait()
    t_alone = threading.Thread(target=alone)
    t_alone.start()
    drain_waits_for(clock, users[0])
    assert "timer" not in board.alone  # the others' GPU work is not done: the turn waits for it
    leave.set()
    for t in [*threads, t_alone]:
        t.join(HANG_S)
    assert [e for e in board.events if e[1] == "alone"] == [("timer", "alone", frozenset({"timer"}))]
    uses = [e for e in board.events if e[1] == "use"]
    assert max(len(seen) for _, _, seen in uses) == 3  # shared
    assert all("timer" not in seen for _, _, seen in uses)  # nobody used the GPU during the turn
    assert arbiter.alone_count == 1 and arbiter.alone_s == pytest.approx(0.2)
    assert [u.client.waited_s for u in users] == pytest.approx([0.2] * 3)  # paused from their pause to the end


def _turn_while_compiling(clock: ManualClock, worker: ThreadProcess, timer: ThreadProcess, call,
                          compiling: threading.Event, compiled: threading.Event, order: list[str]) -> None:
    """Run ``call`` (``worker``'s) on a thread; once its compilation has begun, take a turn alone. The compilation
    ends only inside the turn (``compiled``): a turn that waited for it would never begin. The turn ends, 0.5 s
    later on the clock, once the worker's launch after the compilation waits for it."""
    t = threading.Thread(target=call)
    t.start()
    assert compiling.wait(HANG_S)
    with timer.gate.use(), timer.gate.alone():
        order.append("timed rounds")
        compiled.set()
        until(worker.paused_and_waiting, "the launch after the compilation waits for the turn")
        clock.advance(0.5)
        order.append("timed rounds end")
    t.join(HANG_S)


def test_a_compiling_process_never_holds_up_a_turn_and_continues_after_it():
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    worker, timer = ThreadProcess(arbiter, "worker"), ThreadProcess(arbiter, "timer")
    compiling, compiled, order = threading.Event(), threading.Event(), []

    def student_call():
        with worker.gate.use():
            order.append("launch")
            with worker.gate.released():  # Triton compiling the next kernel: CPU work
                compiling.set()
                compiled.wait(HANG_S)
            order.append("next launch")

    _turn_while_compiling(clock, worker, timer, student_call, compiling, compiled, order)
    assert order == ["launch", "timed rounds", "timed rounds end", "next launch"]
    assert worker.client.waited_s == pytest.approx(0.5)  # paused after its compilation: not the student's time
    assert worker.gate.paused_s == pytest.approx(0.5)


def test_a_compilation_on_a_thread_the_stretch_waits_for_never_holds_up_a_turn():
    # PyTorch runs a CUDA backward pass on a thread of its own while the calling thread waits inside use(); Triton
    # compiles the backward's kernels on that thread
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    worker, timer = ThreadProcess(arbiter, "worker"), ThreadProcess(arbiter, "timer")
    compiling, compiled, order = threading.Event(), threading.Event(), []

    def backward_thread():
        with worker.gate.released():  # compiling the backward's kernel: CPU work
            compiling.set()
            compiled.wait(HANG_S)
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
            ended.wait(2 * HANG_S)  # the calling thread waits for the backward pass
            order.append("after backward")

    _turn_while_compiling(clock, worker, timer, student_call, compiling, compiled, order)
    assert order == ["forward launch", "timed rounds", "timed rounds end", "backward launch", "after backward"]
    with timer.gate.use(), timer.gate.alone():  # the stretch was given back whole and has ended: nothing in use
        pass
    assert worker.gate._users == 0


def test_a_compiling_thread_python_started_lends_nothing_and_a_turn_waits_for_the_stretch():
    # the grader's compiling threads: the thread inside use() may go on with GPU work meanwhile
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    worker, timer = ThreadProcess(arbiter, "worker"), ThreadProcess(arbiter, "timer")
    compiling, compiled, order = threading.Event(), threading.Event(), []

    def compile_thread():
        with worker.gate.released():
            compiling.set()
            compiled.wait(HANG_S)

    def stretch():
        with worker.gate.use():
            pool = threading.Thread(target=compile_thread)
            pool.start()
            pool.join(2 * HANG_S)
            order.append("stretch ends")

    def turn():
        with timer.gate.use(), timer.gate.alone():
            order.append("timed rounds")

    t = threading.Thread(target=stretch)
    t.start()
    assert compiling.wait(HANG_S)
    asker = threading.Thread(target=turn)
    asker.start()
    drain_waits_for(clock, worker)  # the compilation goes on: the turn waits for the stretch around it
    compiled.set()
    t.join(HANG_S)
    asker.join(HANG_S)
    assert order == ["stretch ends", "timed rounds"]
    assert worker.gate._users == 0


def test_lending_threads_and_a_releasing_caller_never_hold_up_a_turn():
    # the engine's thread lends the stretch, then the calling thread releases it too (in either order): the count
    # goes below zero for a while, and a turn asked for meanwhile is granted at once
    arbiter = GpuArbiter(clock=ManualClock())
    worker, timer = ThreadProcess(arbiter, "worker"), ThreadProcess(arbiter, "timer")
    lent, go_on, ended, granted = threading.Event(), threading.Event(), threading.Event(), threading.Event()

    def engine():
        try:
            with worker.gate.released():
                lent.set()
                go_on.wait(2 * HANG_S)
        finally:
            ended.set()

    def caller():
        with worker.gate.use():
            _thread.start_new_thread(engine, ())
            lent.wait(2 * HANG_S)
            with worker.gate.released():
                go_on.wait(2 * HANG_S)  # set by the turn: a turn that waited for this stretch would never begin
                ended.wait(2 * HANG_S)

    def turn():
        with timer.gate.use(), timer.gate.alone():
            granted.set()
            go_on.set()

    t = threading.Thread(target=caller, daemon=True)
    t.start()
    until(lambda: worker.gate._users < 0, "the caller releases the stretch the engine's thread lent")
    threading.Thread(target=turn, daemon=True).start()
    assert granted.wait(HANG_S), "a turn waited for a stretch nobody used"
    t.join(HANG_S)
    with timer.gate.use(), timer.gate.alone():
        pass
    assert worker.gate._users == 0


def test_a_process_that_is_gone_never_blocks_a_turn():
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    stuck, timer = ThreadProcess(arbiter, "stuck"), ThreadProcess(arbiter, "timer")
    holding, let_go, granted = threading.Event(), threading.Event(), threading.Event()

    def hold_forever():
        with stuck.gate.use():
            holding.set()
            let_go.wait(2 * HANG_S)  # as long as the test lasts

    def ask():
        with timer.gate.alone():
            granted.set()

    threading.Thread(target=hold_forever, daemon=True).start()
    assert holding.wait(HANG_S)
    threading.Thread(target=ask, daemon=True).start()
    drain_waits_for(clock, stuck)  # it still runs: the turn waits
    assert not granted.is_set()
    stuck.killed()  # killed (say, its call limit): it is paused for good
    assert granted.wait(HANG_S)
    let_go.set()
    stuck.reaped()


def test_a_paused_process_says_once_per_pause_that_it_waits_to_use_the_gpu():
    """The process's side, on bare pipes: "W" once per pause however many of its threads wait, and again in the
    next pause; none while it may use the GPU."""
    to_gate_r, to_gate_w = os.pipe()
    from_gate_r, from_gate_w = os.pipe()
    os.write(to_gate_w, b"C")
    gate = gpu_gate.Gate(to_gate_r, from_gate_w)

    def said_so_far() -> bytes:  # what the gate has written and we have not read, without waiting
        os.set_blocking(from_gate_r, False)
        try:
            return os.read(from_gate_r, 100)
        except BlockingIOError:
            return b""
        finally:
            os.set_blocking(from_gate_r, True)

    def says_next() -> bytes:
        assert select.select([from_gate_r], [], [], HANG_S)[0], "the gate says nothing"
        return os.read(from_gate_r, 1)

    def use_the_gpu() -> None:
        with gate.use():
            pass

    try:
        use_the_gpu()
        assert said_so_far() == b""
        for _ in range(2):  # two pauses
            os.write(to_gate_w, b"P")
            assert says_next() == b"D"
            threads = [threading.Thread(target=use_the_gpu) for _ in range(3)]
            for t in threads:
                t.start()
            until(lambda: waiting_in(gate._cond) == 3, "three threads wait to use the GPU")  # paused: they wait
            assert said_so_far() == b"W"
            os.write(to_gate_w, b"C")
            for t in threads:
                t.join(HANG_S)
            assert said_so_far() == b""
    finally:
        os.close(to_gate_w)  # the arbiter gone: the gate's listener ends
        gate.listener.join(5)
        for fd in (to_gate_r, from_gate_r, from_gate_w):
            os.close(fd)


def test_a_turn_hurries_the_process_whose_gpu_work_it_waits_for_and_only_until_it_has_paused():
    """A worker running at a CPU niceness is told to hurry (the grader renices it to 0) while a turn waits for its
    stretch of GPU work, and to slow down again once it has paused; one with nothing in flight is not told."""
    clock = ManualClock()
    arbiter = GpuArbiter(clock=clock)
    busy, idle = ThreadProcess(arbiter, "busy"), ThreadProcess(arbiter, "idle")
    told: list[tuple[str, bool, bool]] = []  # (who, on, was the stretch still running)
    inside, running, finish = threading.Event(), threading.Event(), threading.Event()
    busy.client.hurry = lambda on: told.append(("busy", on, running.is_set()))
    idle.client.hurry = lambda on: told.append(("idle", on, False))

    def stretch() -> None:
        with busy.gate.use():
            running.set()
            inside.set()
            finish.wait(HANG_S)
            running.clear()

    def turn() -> None:
        with ThreadProcess(arbiter, "timer").gate.alone():
            pass

    t = threading.Thread(target=stretch)
    t.start()
    assert inside.wait(HANG_S)
    asker = threading.Thread(target=turn)
    asker.start()
    until(idle.client.drained.is_set, "the idle process pauses at once")
    drain_waits_for(clock, busy)  # past the moment to hurry: the busy one is told
    assert told == [("busy", True, True)]
    finish.set()
    t.join(HANG_S)
    asker.join(HANG_S)
    assert told == [("busy", True, True), ("busy", False, False)]


def test_a_worker_at_a_niceness_is_reniced_while_a_turn_waits_for_it(tmp_path):
    """The grader's side of hurrying: every thread of the process and of its children gets the niceness."""
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
        until(lambda: b"ready" in b"".join(process.readers[0].chunks), "the process and its children have started")

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
