"""No timed call finds what an earlier call left in its memory: the replays' outputs and scratch are filled with NaN
(:data:`grader.speed.replay.POISON_BYTE`) before every call — warm-up, estimates, every timed round, and before each
replay of a captured graph, whose static buffers are the same on every replay — always outside the timed region
(before the L2 flush, the hold and the start event). On a CPU with a logging fake clock and a fake replay whose
memory comes from an allocator that hands the same bytes back (as the caching allocator does); on a GPU
(``pytest -m gpu``) with a recorded and replayed Triton kernel that keeps its results in its scratch memory and
returns them, without computing, when it finds them there again."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from grader.speed import timing
from grader.speed.replay import POISON_BYTE, CallMemory
from grader.speed.timing import Candidate, StopRule
from tests.fake_clock import FakeClock

FULL_MS, CACHED_MS = 1.0, 0.1  # the fake cheat's time computing, and returning what it found in its memory
MARK = 0x5A


class LoggingClock(FakeClock):
    """A FakeClock that logs the engine's flushes, holds and marks, and captures as CUDA does: the capture runs the
    body once (nothing executes: the launches are recorded), each replay runs it again on the captured memory."""

    def __init__(self, log: list[str], **kwargs):
        super().__init__(**kwargs)
        self.log = log
        self.capturing = self.replaying = False

    def flush(self) -> None:
        self.log.append("flush")
        super().flush()

    def hold(self, ms: float) -> None:
        self.log.append("hold")
        super().hold(ms)

    def mark(self) -> float:
        self.log.append("mark")
        return super().mark()

    def capture(self, fn):
        self.captures += 1
        self.capturing = True
        try:
            fn()
        finally:
            self.capturing = False

        def replay() -> None:
            self.replaying = True
            try:
                start = self.now_ms
                fn()
                self.now_ms = max(start, self.now_ms - self.graph_speedup_ms)
            finally:
                self.replaying = False

        return replay


class SameBytes:
    """An allocator that hands back the bytes it gave before, contents and all (the caching allocator's reuse of a
    freed block of the same size, made certain)."""

    def __init__(self):
        self.blocks: dict[int, torch.Tensor] = {}

    def __call__(self, nbytes: int) -> torch.Tensor:
        return self.blocks.setdefault(nbytes, torch.zeros(nbytes, dtype=torch.uint8))


class CheatingReplay:
    """A replay (the real :class:`CallMemory` staging, on a CPU) whose kernel keeps its result in its scratch memory
    with a mark, and returns it in CACHED_MS instead of computing in FULL_MS when it finds the mark again."""

    def __init__(self, name: str, clock: LoggingClock, log: list[str]):
        self.name, self.clock, self.log = name, clock, log
        self.memory = CallMemory([16, 64], allocate=SameBytes())  # an output and a scratch buffer
        self.captured: list[torch.Tensor] | None = None
        self.found: list[str] = []  # per executed call: "poison", "mark" (a result left by an earlier call) or "?"

    def stage(self):
        self.log.append(f"setup {self.name}")
        repoison = self.memory.stage()

        def again() -> None:
            self.log.append(f"repoison {self.name}")
            repoison()

        return again

    def __call__(self, inputs):
        if self.clock.replaying:
            memory = self.captured
        else:
            memory = self.memory.take()
            if self.clock.capturing:  # the launches are recorded on this memory; nothing runs now
                self.captured = memory
                self.log.append(f"capture {self.name}")
                return inputs["x"] * 2
        assert memory is not None
        self.log.append(f"call {self.name}")
        scratch = memory[1]
        if bool((scratch == POISON_BYTE).all()):
            self.found.append("poison")
        elif int(scratch[0]) == MARK:
            self.found.append("mark")
        else:
            self.found.append("?")
        self.clock.advance(CACHED_MS if self.found[-1] == "mark" else FULL_MS)
        scratch.fill_(0)
        scratch[0] = MARK  # the result, kept for the next call
        memory[0].fill_(1)
        return inputs["x"] * 2


def _sources():
    return [{"x": torch.arange(4.0)}, {"x": torch.arange(4.0) + 10}]


def _measure(graph: bool, *, poisoned: bool = True, rounds: int = 6, warmup_ms: float = 3.0):
    log: list[str] = []
    clock = LoggingClock(log)
    cheat = CheatingReplay("cheat", clock, log)
    other = CheatingReplay("other", clock, log)  # a second candidate: setups stay each with its own call
    candidates = [Candidate(r.name, r, setup=r.stage if poisoned else None) for r in (cheat, other)]
    result = timing.measure(candidates, _sources(), clock=clock, rule=StopRule(min_rounds=rounds, max_rounds=rounds),
                            warmup_ms=warmup_ms, graph_below_ms=1e9 if graph else None)
    return result, log, cheat


def _check_order(log: list[str], names=("cheat", "other")) -> int:
    """Every executed call of a candidate has its setup (or re-poisoning) after its previous call and before it;
    a timed call (between two marks) has it before the flush, the hold and the start mark; nothing is set up
    between a start and an end mark. Returns the number of timed calls."""
    timed, inside = 0, False
    last_prepared = dict.fromkeys(names, -1)
    last_call = dict.fromkeys(names, -1)
    last_flush = -1
    for i, event in enumerate(log):
        kind, _, name = event.partition(" ")
        if kind == "mark":
            inside = not inside
            if inside:
                assert last_flush == i - 2 and log[i - 1] == "hold", log[max(0, i - 3):i + 1]
        elif kind == "flush":
            last_flush = i
        elif kind in ("setup", "repoison"):
            assert not inside, f"{event} inside a timed region (log entry {i})"
            last_prepared[name] = i
        elif kind in ("call", "capture"):
            assert last_prepared[name] > last_call[name], f"{event} (log entry {i}) without a setup before it"
            if inside:
                timed += 1
                assert last_prepared[name] < last_flush, f"{event}: its setup is not before the flush"
            last_call[name] = i
    assert not inside
    return timed


def test_setup_runs_before_every_call_and_outside_the_timed_region():
    result, log, cheat = _measure(graph=False)
    assert result.mode == "events" and result.rounds == 6 and result.problems == []
    timed = _check_order(log)
    assert timed == 2 * 3 + 2 * 6  # the three estimate calls and every round, per candidate
    calls = [e for e in log if e.startswith("call cheat")]
    assert len(calls) == log.count("setup cheat") > 2 + 3 + 6  # untimed warm-up calls too
    # what it bought: every call of the cheat found poison, none found its mark, every call took its full time
    assert cheat.found == ["poison"] * len(calls)
    assert result.samples["cheat"] == pytest.approx([FULL_MS] * 6)


def test_graph_mode_poisons_the_captured_memory_before_every_replay():
    result, log, cheat = _measure(graph=True)
    assert result.mode == "graph" and result.rounds == 6 and result.problems == []
    _check_order(log)
    captured = log.index("capture cheat")
    replays = log[captured:].count("call cheat")
    assert replays == 6 and log[captured:].count("repoison cheat") == 6
    assert log[captured:].count("setup cheat") == 0  # the graph's memory is poisoned again, none is allocated
    assert cheat.captured is not None and cheat.found == ["poison"] * len(cheat.found)
    assert result.samples["cheat"] == pytest.approx([FULL_MS] * 6)


@pytest.mark.parametrize("graph", [False, True], ids=["events", "graph"])
def test_unpoisoned_the_same_cheat_is_timed_fast(graph):
    """The control: without a setup (the engine as it was) the memory handed back holds the mark, and the cheat
    is timed at CACHED_MS — what the poisoning takes away."""
    result, log, cheat = _measure(graph=graph, poisoned=False)
    assert "setup cheat" not in log and "repoison cheat" not in log
    assert result.samples["cheat"] == pytest.approx([CACHED_MS] * 6) and "mark" in cheat.found


def test_a_setup_that_returns_nothing_runs_again_before_each_replay():
    log: list[str] = []
    clock = LoggingClock(log)

    def fn(inputs):
        log.append("call a")
        clock.advance(0.001)
        return inputs["x"] * 2

    def setup():
        log.append("setup a")

    result = timing.measure([Candidate("a", fn, setup=setup)], _sources(), clock=clock,
                            rule=StopRule(min_rounds=4, max_rounds=4), warmup_ms=0, graph_below_ms=1.0)
    assert result.mode == "graph"
    # the capture runs the body once (a "call" here: this fn cannot tell), set up like every other call
    assert _check_order(log, names=("a",)) == 3 + 4
    assert log.count("setup a") == log.count("call a")


def test_a_failing_setup_is_named():
    clock = FakeClock()

    def fn(inputs):
        clock.advance(1.0)
        return inputs["x"]

    def setup():
        raise MemoryError("no memory for the poisoned buffers")

    with pytest.raises(timing.CandidateError, match="student raised MemoryError") as info:
        timing.measure([Candidate("base", fn), Candidate("student", fn, setup=setup)], _sources(), clock=clock)
    assert info.value.name == "student"


def test_call_memory_stages_poisoned_memory_for_the_next_call_only():
    allocated: list[torch.Tensor] = []

    def allocate(nbytes: int) -> torch.Tensor:
        allocated.append(torch.full((nbytes,), 7, dtype=torch.uint8))  # stale contents
        return allocated[-1]

    memory = CallMemory([8, 0, 32], allocate=allocate)
    assert memory.nbytes == 40
    plain = memory.take()  # nothing staged: allocated, left as the allocator gave it (as before)
    assert [t.numel() for t in plain] == [8, 0, 32] and all(bool((t == 7).all()) for t in plain)
    again = memory.stage()
    staged = allocated[-3:]
    assert all(bool((t == POISON_BYTE).all()) for t in staged)
    taken = memory.take()
    assert len(taken) == 3 and all(t is s for t, s in zip(taken, staged))  # the staged memory
    fresh = memory.take()  # and only once: the next call allocates its own again
    assert all(f is not t for f, t in zip(fresh, staged))
    taken[0].fill_(1)
    taken[2][5] = 3  # the call wrote its results
    again()  # graph mode: the captured call's memory, poisoned again
    assert all(bool((t == POISON_BYTE).all()) for t in taken)
    validation = memory.take(poisoned=True)  # validation runs: poisoned when allocated in the call
    assert all(bool((t == POISON_BYTE).all()) for t in validation)


def test_a_second_stage_replaces_the_first():
    memory = CallMemory([4], allocate=lambda n: torch.zeros(n, dtype=torch.uint8))
    memory.stage()
    memory.stage()
    first = memory.take()
    assert bool((first[0] == POISON_BYTE).all())
    assert not bool((memory.take()[0] == POISON_BYTE).all())  # nothing staged any more


# --- on a GPU: a recorded Triton kernel that keeps its result in its scratch memory ------------------------------

N = 1 << 22  # float32 elements
BLOCK = 1024
ITERS = 2048  # dependent multiply-adds per element: computing costs far more than copying the cached result


@triton.jit
def _cheat_kernel(x_ptr, y_ptr, cache_ptr, marks_ptr, hits_ptr, n, cheat, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    key = tl.load(x_ptr + pid * BLOCK).to(tl.int32, bitcast=True)  # the input's fingerprint, per block
    mark = tl.load(marks_ptr + 2 * pid)
    seen = tl.load(marks_ptr + 2 * pid + 1)
    found = (mark == 0x5EED1234) & (seen == key) & (cheat != 0)
    # Every warp of the block reads the marks before any warp writes them: without the barrier a late warp could
    # read the marks an early warp wrote in this very call and return its share of a cache not yet written.
    tl.debug_barrier()
    if found:  # an earlier call left its result for this input: return it without computing
        y = tl.load(cache_ptr + offs, mask=mask, other=0.0)
        tl.atomic_add(hits_ptr, 1)
    else:
        y = x
        for _ in range(ITERS):
            y = y * 0.5 + x
        tl.store(cache_ptr + offs, y, mask=mask)
        tl.store(marks_ptr + 2 * pid, 0x5EED1234)
        tl.store(marks_ptr + 2 * pid + 1, key)
    tl.store(y_ptr + offs, y, mask=mask)


def _call(cheat: bool):
    """The student's call: one buffer holds the output, the cached results, the marks (a magic word and the
    fingerprint, per block) and the count of blocks that returned a cached result (an output, to see it)."""

    def call(inputs):
        x = inputs["x"]
        n = x.numel()
        grid = (triton.cdiv(n, BLOCK),)
        state = torch.empty(2 * n + 2 * grid[0] + 1, dtype=torch.float32, device=x.device)
        y, cache = state[:n], state[n:2 * n]
        marks = state[2 * n:2 * n + 2 * grid[0]].view(torch.int32)
        hits = state[2 * n + 2 * grid[0]:].view(torch.int32)
        hits.zero_()
        _cheat_kernel[grid](x, y, cache, marks, hits, n, int(cheat), ITERS=ITERS, BLOCK=BLOCK, num_warps=4)
        return {"y": y, "hits": hits}

    return call


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    """The cheat and its honest twin (the same kernel, never returning what it finds), recorded and loaded as the
    timer loads them (the repo's record and replay path)."""
    from grader.speed import recorder, replay

    x = torch.randn(N, device="cuda")
    loaded = {}
    for name, cheat in (("cheat", True), ("honest", False)):
        call = _call(cheat)
        call(timing.fresh_inputs({"x": x}))  # compiles
        torch.cuda.synchronize()
        _, plan = recorder.record_call(call, timing.fresh_inputs({"x": x}))
        assert [b.role for b in plan.buffers] == ["input", "output"], plan.buffers
        loaded[name] = replay.Replay(plan, tmp_path_factory.mktemp(name))
    return loaded


@pytest.mark.gpu
def test_the_replayed_cheat_finds_its_results_only_where_nothing_poisons_its_memory(replays):
    cheat, honest = replays["cheat"], replays["honest"]
    x = torch.randn(N, device="cuda")
    honest.poison = True  # a validation run: computes, whatever its memory held
    want = honest({"x": x})["y"].clone()
    honest.poison = False
    assert cheat.memory.nbytes == 4 * (2 * N + 2 * (N // BLOCK) + 1)  # what each call's poisoning fills
    # the premise: called as the engine called it before (memory as the caching allocator hands it back, nothing
    # allocated between the calls), later calls find an earlier call's results in that memory and skip the work
    hits = []
    for k in range(4):
        out = cheat({"x": x})
        hits.append(int(out["hits"].item()))  # read on the host: nothing allocated on the GPU
        if k < 3:
            del out  # its memory back to the allocator, for the next call
    assert max(hits[1:]) > 0, hits
    assert torch.equal(out["y"], want)  # what it found is right: only the time would be wrong
    del out
    # staged before each call (the engine's Candidate.setup): poisoned memory, nothing found, the work done
    for _ in range(3):
        cheat.stage()
        out = cheat({"x": x})
        assert int(out["hits"].item()) == 0 and torch.equal(out["y"], want)
        del out
    cheat.poison = True  # validation runs are poisoned as before
    try:
        assert int(cheat({"x": x})["hits"].item()) == 0
    finally:
        cheat.poison = False


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True], ids=["events", "graph"])
def test_the_replayed_cheat_gains_nothing_in_the_timing_engine(replays, graph):
    """Timed as the trusted timer times a replay (``setup=replay.stage``), beside its honest twin, on one input set
    (every call a repeat): every call computes, and the cheat is no faster. The control, without the setup, in graph
    mode (deterministic there: every replay of the captured graph runs on the same memory): the replays find the
    results and are timed fast."""
    from grader.speed import clocks

    sources = [{"x": torch.randn(N, device="cuda")}]

    def run(poisoned: bool):
        hits: list[int] = []
        first: dict[str, torch.Tensor] = {}

        def check(output, index):
            hits.append(int(output["hits"].item()))
            if "y" not in first:
                first["y"] = output["y"].clone()
                return None
            if torch.equal(output["y"], first["y"]):
                return None
            y, want = output["y"], first["y"]
            return (f"a timed output differs from the first (call {len(hits)}, poisoned={poisoned}: "
                    f"{int((y != want).sum())} of {y.numel()} differ, {int(y.isnan().sum())} NaN here, "
                    f"{int(want.isnan().sum())} NaN in the first, {hits[-1]} blocks found a result)")

        candidates = [Candidate(name, replay, check if name == "cheat" else None,
                                setup=replay.stage if poisoned else None) for name, replay in replays.items()]
        result = timing.measure(candidates, sources, clock=clocks.CudaClock(),
                                rule=StopRule(min_rounds=10, max_rounds=10), warmup_ms=5.0,
                                graph_below_ms=1e9 if graph else None)
        assert result.mode == ("graph" if graph else "events"), result.notes
        assert result.problems == [] and len(hits) == 1 + result.rounds and result.rounds == 10
        return result, hits

    result, hits = run(poisoned=True)
    assert hits == [0] * len(hits)
    assert result.ratio("cheat", "honest") > 0.7, result.to_dict()
    if graph:
        result, hits = run(poisoned=False)
        assert all(h > 0 for h in hits[2:]), hits  # the first replay computes; every later one finds its results
        assert result.ratio("cheat", "honest") < 0.5, result.to_dict()
