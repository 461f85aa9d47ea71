"""Who may use one GPU, and when one process has it alone: the grader's side of
:mod:`grader.checks.gpu_gate` (read that first).

Every process that runs on a GPU slot (a worker, a trusted timer) is connected to the slot's
:class:`GpuArbiter` by two pipes. The processes share the GPU freely; a request for the GPU alone (a timer's timed
rounds, a worker's autotuning) waits its turn (first come, first served), then every other process is paused: each
says when nothing of its own runs on the GPU any more, which takes as long as the GPU work it has in flight, never
as long as a compilation. The requester is granted the GPU, and when it is done the others continue; unless
another turn was asked for meanwhile: that one follows at once, the others still paused (for at most
:data:`MAX_CHAIN_S`), so that the wait for their GPU work in flight is paid once for turns that come together.

A process that dies counts as paused and done: an arbiter never waits for a process that is gone, and one that
never answers is bounded by the limits the grader enforces on it (a worker's call limit, a timer's own limit).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator

from grader.checks.gpu_gate import Gate
from grader.checks.host_clock import MONOTONIC, HostClock

SLOW_DRAIN_S = 10.0  # a pause that takes longer is said on stderr (diagnostics)
# Turns asked for while one runs follow it without the others continuing in between, for at most this long: a
# turn's pause waits for every other process's GPU work in flight (a correctness case, a validation), which is
# paid once for the whole chain; past this the others get the GPU before the next turn (decisions 0003, 0013).
MAX_CHAIN_S = 10.0
TURNS_KEPT = 100_000  # for --profile's window-by-window view: about 11,000 submissions' turns (9 each)
HURRY_AFTER_S = 0.05  # a process that has not paused by then has GPU work in flight: it is told to hurry (0013)


class Client:
    """One process's connection (the grader's ends of its two pipes). Pass :attr:`process_fds` to the process,
    then call :meth:`started`; :meth:`close` when it has ended."""

    def __init__(self, arbiter: GpuArbiter, name: str, role: str = "worker"):
        self.arbiter, self.name, self.role = arbiter, name, role  # role: "worker", "timer", "grader"
        to_process_r, self._to_process = os.pipe()
        self._from_process, from_process_w = os.pipe()
        self.process_fds = (to_process_r, from_process_w)  # what the process reads, what it writes
        self.drained = threading.Event()  # set when it has answered every pause sent so far
        self.drained_at = 0.0  # when it last answered a pause
        self.doing = ""  # what the process runs now, as whoever started it says (for the profile)
        self.drained_doing = ""  # what it was running when it last answered a pause
        self._pauses_sent = self._pauses_answered = 0
        self.done = threading.Event()  # its time alone is over
        self.gone = False
        # Called with True when the process is asked to pause with GPU work in flight, with False once it has paused:
        # a worker that runs at a CPU niceness finishes the work a turn waits for at the niceness of the waiting.
        self.hurry: Callable[[bool], None] | None = None
        self._hurried = False
        self.waited_s = 0.0  # paused by others, or waiting for the GPU alone: not the process's own time
        self.blocked_s = 0.0  # of that, with a thread waiting to use the GPU (said "W"): held up, not compiling
        self._wants_since: float | None = None
        self._pausing = False
        self._paused_since: float | None = None
        self._asked_at: float | None = None
        self._send_lock = threading.Lock()

    def started(self) -> None:
        """The process has its ends: close ours of them and start listening."""
        for fd in self.process_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._start_listening()

    def _start_listening(self) -> None:
        threading.Thread(target=self._listen, name=f"gpu-arbiter-{self.name}", daemon=True).start()

    def close(self) -> None:
        self._gone()
        with contextlib.suppress(OSError):
            os.close(self._to_process)

    def waiting_now(self) -> float:
        """Seconds of :attr:`waited_s`, counting a pause or a wait still under way."""
        now = self.arbiter.clock.now()
        extra = (now - self._paused_since) if self._paused_since is not None else 0.0
        extra += (now - self._asked_at) if self._asked_at is not None else 0.0
        return self.waited_s + extra

    def send(self, byte: bytes) -> None:
        with self._send_lock:
            if self.gone:  # nothing to tell: it counts as paused, and done
                return
            self._sent(byte)  # counted first: the process may act on the byte before the write returns
            try:
                os.write(self._to_process, byte)
            except OSError:
                failed = True
            else:
                failed = False
        if failed:
            self._gone()

    def _sent(self, byte: bytes) -> None:
        now = self.arbiter.clock.now()
        if byte == b"P":
            self._pausing = True
            self._pauses_sent += 1
            self.drained.clear()
        elif byte == b"C":
            if self._paused_since is not None:
                self.waited_s += now - self._paused_since
            if self._wants_since is not None:
                self.blocked_s += now - self._wants_since
                self.arbiter._count(self.arbiter.blocked_by_role, self.role, now - self._wants_since)
            self._pausing, self._paused_since, self._wants_since = False, None, None
        elif byte == b"G" and self._asked_at is not None:
            self.waited_s += now - self._asked_at
            self._asked_at = None

    def _listen(self) -> None:
        clock = self.arbiter.clock
        while True:
            try:
                byte = os.read(self._from_process, 1)
            except OSError:
                byte = b""
            if byte == b"D":
                with self._send_lock:  # paused from now: until here the process was finishing its own work
                    if self._pausing and self._paused_since is None:
                        self._paused_since = clock.now()
                    self._pauses_answered += 1
                    self.drained_at, self.drained_doing = clock.now(), self.doing
                    if self._pauses_answered >= self._pauses_sent:  # the answer to the latest pause
                        self.drained.set()
                        self._hurry(False)
            elif byte == b"W":
                with self._send_lock:  # a "W" read after the "C" that answered it is stale
                    if self._pausing and self._wants_since is None:
                        self._wants_since = clock.now()
            elif byte == b"A":
                self._asked_at = clock.now()
                self.arbiter._ask(self)
            elif byte == b"R":
                self.done.set()
            elif not byte:
                self._gone()
                with contextlib.suppress(OSError):
                    os.close(self._from_process)
                return

    def hurry_up(self) -> None:
        """A turn waits for this process's GPU work in flight (see :attr:`hurry`)."""
        with self._send_lock:
            if not (self.drained.is_set() or self.gone):
                self._hurry(True)

    def _hurry(self, on: bool) -> None:
        if self.hurry is None or self._hurried == on:
            return
        self._hurried = on
        try:
            self.hurry(on)
        except Exception as exc:  # never the arbiter's undoing: the turn only waits longer
            print(f"gpu arbiter: could not change the CPU niceness of {self.name}: {exc}", file=sys.stderr)

    def _gone(self) -> None:
        with self._send_lock:
            self.gone = True
            self.drained.set()
            self.done.set()
        self.arbiter._forget(self)


class _Turn:
    """One request for the GPU alone: a process's (granted with ``G``, over when it says ``R`` or dies) or the
    grader's own (:meth:`GpuArbiter.alone`)."""

    def __init__(self, clock: HostClock, client: Client | None = None):
        self.client = client
        self.asked = clock.now()
        self.granted = threading.Event()
        self.done = client.done if client is not None else threading.Event()

    def grant(self) -> None:
        if self.client is not None:
            self.client.done.clear()
            self.client.send(b"G")
        self.granted.set()


class GpuArbiter:
    """The GPU of one slot, shared by its processes and lent to one of them alone at a time (see the module
    docstring). The counters are for ``grader grade --profile``. ``clock`` times the waits, the turns and the
    pauses (a test's clock moves only when the test says)."""

    def __init__(self, *, clock: HostClock = MONOTONIC) -> None:
        self.clock = clock
        self._cond = threading.Condition()
        self._clients: list[Client] = []
        self._queue: deque[_Turn] = deque()
        self._paused: list[Client] = []  # paused for the turn under way
        self._turn = False
        self.alone_s = 0.0  # held alone, in all
        self.alone_count = 0
        self.alone_by_role: dict[str, float] = {}  # role -> seconds its processes held the GPU alone
        # (granted, ended) of the turns, on the clock; the latest only, for a server that runs for a term
        self.turns: deque[tuple[float, float]] = deque(maxlen=TURNS_KEPT)
        self.drain_s = 0.0  # waiting for the others' GPU work to finish, before each turn
        self.queue_s = 0.0  # requests waiting for their turn (the drain included), in all
        self.chained = 0  # turns that followed another without the others continuing in between
        # role -> seconds its processes waited to use the GPU while paused (held up by the turns, not compiling)
        self.blocked_by_role: dict[str, float] = {}
        # (role, what it was doing) -> [turns, seconds]: the last to pause before a turn
        self.held_up_by: dict[tuple[str, str], list[float]] = {}
        self._counting = threading.Lock()  # the per-role figures: added to from the clients' threads too
        threading.Thread(target=self._serve, name="gpu-arbiter", daemon=True).start()

    def connect(self, name: str, *, role: str = "worker") -> Client:
        """A new process's connection; it starts paused when another process has the GPU alone now. ``role``
        ("worker", "timer", "grader") sorts the drain time in :attr:`held_up_by`."""
        client = Client(self, name, role)
        with self._cond:
            self._clients.append(client)
            if self._turn:
                self._paused.append(client)
                client.send(b"P")  # it has not started: nothing of its own runs on the GPU yet
            else:
                client.send(b"C")
        return client

    def connect_here(self, name: str, *, synchronize: Callable[[], None]) -> Gate:
        """A gate for GPU work of the grader's own process (its float64 references): a client like a process's,
        both ends of whose pipes stay here. ``synchronize`` waits for that work on this GPU (for a pause)."""
        client = self.connect(name, role="grader")
        gate = Gate(*client.process_fds, synchronize=synchronize, clock=self.clock)
        client._start_listening()
        return gate

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """The GPU alone for the grader's own code: a turn like a process's."""
        turn = _Turn(self.clock)
        self._enqueue(turn)
        turn.granted.wait()
        try:
            yield
        finally:
            turn.done.set()

    def _ask(self, client: Client) -> None:
        self._enqueue(_Turn(self.clock, client))

    def _enqueue(self, turn: _Turn) -> None:
        with self._cond:
            self._queue.append(turn)
            self._cond.notify_all()

    def _forget(self, client: Client) -> None:
        with self._cond:
            if client in self._clients:
                self._clients.remove(client)

    def _serve(self) -> None:
        while True:
            with self._cond:
                while (turn := self._pop_live()) is None:
                    self._cond.wait()
                self._turn = True
                others = [c for c in self._clients if c is not turn.client and not c.gone]
                self._paused = list(others)
            self._drain(turn, others)
            chain_started = self.clock.now()
            while True:
                granted = self.clock.now()
                turn.grant()
                turn.done.wait()
                with self._cond:
                    held = self.clock.now() - granted
                    self.alone_s += held
                    self.turns.append((granted, granted + held))
                    self._count(self.alone_by_role, turn.client.role if turn.client is not None else "grader", held)
                    self.alone_count += 1
                    ended, turn = turn.client, self._next_in_chain(chain_started)
                    if turn is None:
                        self._turn = False
                        paused, self._paused = self._paused, []
                        break
                    # The next turn was asked for already: the others stay paused (they would only be paused
                    # again at once, after one more stretch each), and only the process whose turn ended, which
                    # went on without a pause, has to finish its GPU work first.
                    pause = [ended] if ended is not None and ended is not turn.client and not ended.gone else []
                    self._paused += pause
                    waiting = turn.client is not None and turn.client in self._paused
                    if waiting:
                        self._paused.remove(turn.client)
                    self.chained += 1
                self._drain(turn, pause)
                if waiting:
                    turn.client.send(b"C")  # before its G: it holds the GPU, it is not paused
            for other in paused:
                if not other.gone:
                    other.send(b"C")

    def _count(self, figures: dict[str, float], role: str, seconds: float) -> None:
        with self._counting:
            figures[role] = figures.get(role, 0.0) + seconds

    def _next_in_chain(self, chain_started: float) -> _Turn | None:
        """The turn that follows the one just over without the others continuing in between, if one was asked
        for and the chain has not lasted :data:`MAX_CHAIN_S` (called holding the lock)."""
        return self._pop_live() if self.clock.now() - chain_started < MAX_CHAIN_S else None

    def _pop_live(self) -> _Turn | None:
        """The first queued turn whose process is still there, if any (called holding the lock)."""
        while self._queue:
            turn = self._queue.popleft()
            if turn.client is None or not turn.client.gone:
                return turn
        return None

    def _drain(self, turn: _Turn, others: list[Client]) -> None:
        """Pause ``others`` before ``turn`` and wait until nothing of theirs runs on the GPU."""
        started = self.clock.now()
        for other in others:
            other.send(b"P")
        hurry_at = started + HURRY_AFTER_S  # those with nothing in flight have answered by then
        for other in others:
            self.clock.wait_until(other.drained, hurry_at)
        for other in others:
            other.hurry_up()
        for other in others:
            if not self.clock.wait_until(other.drained, self.clock.now() + SLOW_DRAIN_S):
                print(f"gpu arbiter: waiting for {other.name} to pause before a turn of "
                      f"{turn.client.name if turn.client else 'the grader'}", file=sys.stderr, flush=True)
                other.drained.wait()
        drained = self.clock.now()
        self.drain_s += drained - started
        last = max(others, key=lambda c: c.drained_at, default=None)
        if last is not None and last.drained_at > started:  # who the turn waited for the longest
            held = self.held_up_by.setdefault((last.role, last.drained_doing), [0, 0.0])
            held[0] += 1
            held[1] += last.drained_at - started
        self.queue_s += drained - turn.asked
