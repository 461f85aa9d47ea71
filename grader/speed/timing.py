"""The timing engine: device time of several implementations of one computation, measured side by
side so that their *ratios* are stable even on a noisy machine.

How one measurement goes (:func:`measure`):

1. **Warm-up.** Each candidate runs once on every input set (JIT compilation, autotuning,
   ``torch.compile``), then for ~``warmup_ms`` more. Each output is handed to the candidate's
   ``check`` — the grader uses that to remember the student's result for each input set.
2. **Mode.** If the fastest candidate takes less than ``graph_below_ms`` per call, host-side
   launch overhead would dominate an event-timed call, so every candidate is captured in a CUDA
   graph and the graph is replayed instead (fresh input values are copied into the graph's static
   input buffers before each replay). If any capture fails, all candidates stay in event mode, so
   the comparison stays fair.
3. **Rounds.** One round times every candidate once, in an order that rotates from round to round.
   Before each timed call the inputs are fresh clones of one of the input sets (sets alternate, so
   a result cached from the previous call is wrong for this one), the L2 cache is flushed, and the
   GPU is held busy (``Clock.hold``) for longer than the candidate takes to *launch* its work
   (measured during the warm-up): the host has queued the whole call before the GPU reaches the start
   event, so the two CUDA events around the call measure device time alone, never the Python launch
   path. After the round, one synchronization, then every output is re-checked (untimed): a kernel
   that returns a cached result is caught, not timed as fast.

   **Poisoned memory.** A candidate may have a ``setup``, run before *every* call — warm-up, the
   calls that estimate its time, every timed call — and always outside the timed region (before the
   L2 flush, the hold and the start event). The trusted timer's replays use it to allocate the next
   call's outputs and scratch memory and fill them with NaN (:meth:`grader.speed.replay.Replay.stage`):
   memory the caching allocator hands back would otherwise still hold the previous call's results, and a
   kernel could find them there and skip its work. In graph mode the captured graph runs on the very same
   static buffers on every replay: the callable ``setup`` returned before the capture (it re-fills the
   memory the captured call used) runs before each replay, beside the refill of the static inputs.
4. **Stopping.** After ``min_rounds``, stop as soon as every candidate's median is known to
   ``rel_se`` (relative standard error of the median, from the interquartile range), or the time
   budget or ``max_rounds`` is reached.

Why not just ``triton.testing.do_bench``: it times one function in isolation on the same inputs,
for a fixed time. Ratios need the candidates interleaved round by round (clock and thermal drift
then move all of them together), grading needs fresh inputs and re-checked outputs, and a budget
needs adaptive stopping. Its building blocks are reused: the L2 flush is Triton's benchmark buffer
(``driver.get_empty_cache_for_benchmark`` / ``clear_cache``), ``do_bench`` itself measures the
roofline (:mod:`grader.speed.probes`), and graph capture disables the garbage collector as
``triton.testing.cuda_graph_without_gc`` does.

Everything device-specific sits behind :class:`~grader.speed.clocks.Clock`; the tests' ``FakeClock``
(tests/fake_clock.py) is a deterministic stand-in that exercises the statistics (:mod:`grader.speed.stats`), the
stopping rule and the interleaving on a CPU.

The grader never times in the process that imported the student's module: its trusted timer replays the
student's recorded kernels (:mod:`grader.speed.trusted`); in the student's worker, :mod:`grader.speed.tamper` says
whether anything timing goes through was replaced.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grader.speed.clocks import Clock
from grader.speed.stats import Stats, StopRule, summarize

# The GPU is held this long before a timed call: HOLD_FACTOR × the candidate's launch time (host time
# from the call to its return, measured in the warm-up) plus HOLD_MIN_MS, at most HOLD_MAX_MS. A call
# that takes longer than that to launch (it synchronizes, say) has its launch gaps measured: say so.
HOLD_FACTOR = 1.5
HOLD_MIN_MS = 0.05
HOLD_MAX_MS = 5.0
DEFAULT_RULE = StopRule()


def hold_ms(launch_ms: float) -> float:
    """How long to hold the GPU before a call that takes ``launch_ms`` of host time to launch (uncapped: a result
    above HOLD_MAX_MS means the call's launch gaps will be measured)."""
    return HOLD_FACTOR * launch_ms + HOLD_MIN_MS


@dataclass(frozen=True)
class Candidate:
    """One implementation to time. ``fn(inputs)`` is the timed call. ``check(output, set_index)``
    runs untimed after every call (warm-up included) and returns a problem, or None. ``setup()`` runs
    before every call, outside the timed region (the replays' outputs and scratch memory filled with
    NaN); where it returns a callable, graph mode calls that one before each replay of the graph captured
    after it (it re-fills the memory the captured call used), else ``setup`` again."""

    name: str
    fn: Callable[[dict[str, Any]], Any]
    check: Callable[[Any, int], str | None] | None = None
    setup: Callable[[], Any] | None = None


class CandidateError(RuntimeError):
    """A candidate raised while being measured; ``name`` says which one."""

    def __init__(self, name: str, error: BaseException):
        super().__init__(f"{name} raised {type(error).__name__}: {error}")
        self.name = name
        self.error = error


@dataclass
class Measurement:
    samples: dict[str, list[float]]  # ms per timed call, by candidate, in round order
    mode: str  # "events" or "graph"
    stop: str  # "converged", "budget", "max_rounds" or "problem"
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warmup_s: float = 0.0  # wall time of the warm-up (compilation and autotuning included)
    timed_s: float = 0.0  # wall time of the timed rounds

    @property
    def rounds(self) -> int:
        return min((len(s) for s in self.samples.values()), default=0)

    def stats(self, name: str) -> Stats:
        return summarize(self.samples[name])

    def ratio(self, numerator: str, denominator: str) -> float:
        """``median(numerator) / median(denominator)``: e.g. baseline over student = speedup."""
        return self.stats(numerator).median / self.stats(denominator).median

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "stop": self.stop,
            "rounds": self.rounds,
            "times": {name: self.stats(name).to_dict() for name, s in self.samples.items() if s},
            "problems": list(self.problems),
            "notes": list(self.notes),
        }


def clone_exact(value: Any) -> Any:
    """A fresh copy of a tensor with the same strides and storage offset (non-tensors as is)."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    n = value.untyped_storage().nbytes() // value.element_size()
    base = torch.empty(0, dtype=value.dtype, device=value.device).set_(value.untyped_storage(), 0, (n,), (1,))
    return base.clone().as_strided(value.shape, value.stride(), value.storage_offset())


def fresh_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: clone_exact(v) for k, v in inputs.items()}


def refill(static: Mapping[str, Any], source: Mapping[str, Any]) -> None:
    """Copy ``source``'s values into the static input buffers of a captured graph."""
    import torch

    for k, v in source.items():
        if isinstance(v, torch.Tensor):
            static[k].copy_(v)


def _call(candidate: Candidate, inputs: dict[str, Any]) -> Any:
    try:
        return candidate.fn(inputs)
    except Exception as exc:
        raise CandidateError(candidate.name, exc) from exc


def _setup(candidate: Candidate, hook: Callable[[], Any] | None = None) -> Any:
    """Run ``hook`` (default: the candidate's ``setup``), never inside a timed region; what it returns."""
    hook = hook or candidate.setup
    if hook is None:
        return None
    try:
        return hook()
    except Exception as exc:
        raise CandidateError(candidate.name, exc) from exc


def measure(
    candidates: Sequence[Candidate],
    sources: Sequence[Mapping[str, Any]],
    *,
    clock: Clock,
    rule: StopRule = DEFAULT_RULE,
    warmup_ms: float = 25.0,
    graph_below_ms: float | None = 0.02,
) -> Measurement:
    """Time ``candidates`` interleaved on fresh copies of ``sources`` (see the module docstring).

    Raises :class:`CandidateError` if a candidate raises. A problem reported by a ``check`` ends
    the measurement (``stop == "problem"``) with the problem listed.
    """
    if not candidates:
        raise ValueError("nothing to measure")
    if not sources:
        raise ValueError("no input sets")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"candidate names must be unique: {names}")
    result = Measurement({c.name: [] for c in candidates}, "events", "")

    # 1. Warm-up: every input set once (compiles, and lets checks see each set's result), then a
    #    few timed calls per candidate to estimate its duration and its launch time, then warm-up until
    #    warmup_ms.
    warmup_start = clock.wall()
    for candidate in candidates:
        for index, source in enumerate(sources):
            inputs = fresh_inputs(source)
            _setup(candidate)
            output = _call(candidate, inputs)
            clock.sync()
            if not _checked(result, candidate, output, index):
                return result
    estimates, holds = _estimate(candidates, sources, clock, warmup_ms, result)

    # 2. Mode: graphs when launch overhead would dominate the fastest candidate.
    runners: dict[str, Callable[[int], Any]] = {}
    if graph_below_ms is not None and min(estimates.values()) < graph_below_ms:
        runners = _capture_all(candidates, sources, clock)
        if runners:
            result.mode = "graph"
        else:
            result.notes.append("CUDA graph capture failed for a candidate: timed with events instead")
    if not runners:
        for candidate in candidates:
            runners[candidate.name] = _event_runner(candidate, sources)
    result.warmup_s = clock.wall() - warmup_start
    _rounds(candidates, sources, clock, rule, runners, holds, result)
    return result


def _checked(result: Measurement, candidate: Candidate, output: Any, index: int) -> bool:
    """Run the candidate's check on ``output`` (untimed); a problem ends the measurement."""
    if candidate.check is None:
        return True
    problem = candidate.check(output, index)
    if problem:
        result.problems.append(problem)
        result.stop = "problem"
        return False
    return True


def _estimate(candidates: Sequence[Candidate], sources: Sequence[Mapping[str, Any]], clock: Clock, warmup_ms: float,
              result: Measurement) -> tuple[dict[str, float], dict[str, float]]:
    """Each candidate's time (a few held, timed calls) and how long to hold the GPU before each of its calls, then
    its warm-up calls until ``warmup_ms``."""
    estimates, holds = {}, {}
    for candidate in candidates:
        times, launches = [], []
        for k in range(3):
            inputs = fresh_inputs(sources[k % len(sources)])
            _setup(candidate)  # before the flush, the hold and the start event: never timed
            clock.flush()
            # The first call is held the longest; the others as long as the slowest launch so far needs, as the
            # rounds will be (every millisecond held is one the GPU does nothing, in a turn others wait for).
            clock.hold(min(HOLD_MAX_MS, hold_ms(max(launches))) if launches else HOLD_MAX_MS)
            launched = clock.wall()
            start = clock.mark()
            _call(candidate, inputs)
            end = clock.mark()
            launches.append((clock.wall() - launched) * 1e3)
            clock.sync()
            times.append(clock.elapsed_ms(start, end))
        estimates[candidate.name] = max(statistics.median(times), 1e-6)
        hold = hold_ms(statistics.median(launches))
        holds[candidate.name] = min(HOLD_MAX_MS, hold)
        if hold > HOLD_MAX_MS:
            result.notes.append(f"{candidate.name} takes {statistics.median(launches):.2f} ms to launch a call (does "
                                "it wait for the GPU?): its time includes the gaps while it launches")
        extra = min(100, int(warmup_ms / estimates[candidate.name]))
        for k in range(extra):
            inputs = fresh_inputs(sources[k % len(sources)])
            _setup(candidate)
            _call(candidate, inputs)
        clock.sync()
    return estimates, holds


def _rounds(candidates: Sequence[Candidate], sources: Sequence[Mapping[str, Any]], clock: Clock, rule: StopRule,
            runners: dict[str, Callable[[int], Any]], holds: dict[str, float], result: Measurement) -> None:
    """3. Rounds, each candidate once per round in a rotating order, with the stopping rule after each."""
    started = clock.wall()
    round_index = 0
    while True:
        offset = round_index % len(candidates)
        order = candidates[offset:] + candidates[:offset]
        index = round_index % len(sources)
        pending = []
        for candidate in order:
            prepare, run = runners[candidate.name](index)  # fresh inputs, and the candidate's setup
            clock.flush()
            clock.hold(holds[candidate.name])  # the whole call is queued before the GPU reaches `start`
            start = clock.mark()
            output = run(prepare)
            end = clock.mark()
            pending.append((candidate, start, end, output))
        clock.sync()
        for candidate, start, end, _ in pending:
            result.samples[candidate.name].append(clock.elapsed_ms(start, end))
        for candidate, _, _, output in pending:
            if not _checked(result, candidate, output, index):
                return
        del pending
        round_index += 1
        reason = rule.check(result.samples, clock.wall() - started) if _should_check(round_index) else None
        if reason:
            result.stop = reason
            result.timed_s = clock.wall() - started
            return


def _should_check(rounds: int) -> bool:
    # Summaries sort every sample list: check each round early on, then every 5th round.
    return rounds < 50 or rounds % 5 == 0


def _event_runner(candidate: Candidate, sources: Sequence[Mapping[str, Any]]):
    def runner(index: int):
        inputs = fresh_inputs(sources[index])  # before the flush: the copy does not stay in L2
        _setup(candidate)  # outputs and scratch poisoned, before the flush too
        return inputs, lambda prepared: _call(candidate, prepared)

    return runner


def _capture_all(candidates, sources, clock: Clock) -> dict[str, Callable[[int], Any]]:
    runners = {}
    for candidate in candidates:
        static = fresh_inputs(sources[0])
        box: dict[str, Any] = {}
        # Before the capture, outside it: the captured call runs on the memory this prepares, and every replay
        # runs on that same memory, so it is poisoned again before each replay.
        repoison = _setup(candidate)
        if not callable(repoison):
            repoison = candidate.setup

        def body(candidate=candidate, static=static, box=box):
            box["out"] = _call(candidate, static)

        replay = clock.capture(body)
        if replay is None:
            return {}

        def runner(index: int, candidate=candidate, static=static, replay=replay, box=box, repoison=repoison):
            refill(static, sources[index])
            if repoison is not None:
                _setup(candidate, repoison)

            def run(_prepared):
                replay()
                return box.get("out")

            return None, run

        runners[candidate.name] = runner
    return runners
