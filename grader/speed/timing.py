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
4. **Stopping.** After ``min_rounds``, stop as soon as every candidate's median is known to
   ``rel_se`` (relative standard error of the median, from the interquartile range), or the time
   budget or ``max_rounds`` is reached.

Why not just ``triton.testing.do_bench``: it times one function in isolation on the same inputs,
for a fixed time. Ratios need the candidates interleaved round by round (clock and thermal drift
then move all of them together), grading needs fresh inputs and re-checked outputs, and a budget
needs adaptive stopping. Its building blocks are reused: the L2 flush is Triton's benchmark buffer
(``driver.get_empty_cache_for_benchmark`` / ``clear_cache``), ``do_bench`` itself measures the
roofline (:func:`roofline`), and graph capture disables the garbage collector as
``triton.testing.cuda_graph_without_gc`` does.

Everything device-specific sits behind :class:`Clock`; the tests' ``FakeClock`` (tests/fake_clock.py) is a
deterministic stand-in that exercises the statistics, the stopping rule and the interleaving on a CPU.

The grader never times in the process that imported the student's module: its trusted timer replays the
student's recorded kernels (:mod:`grader.speed.trusted`). In the student's worker, :func:`capture_primitives`
still records, before any student module is imported, every callable that timing goes through (CUDA events,
synchronization, ``time.perf_counter``, ``do_bench``, this module's own functions, the statistics), and
:func:`tampered` names whatever was replaced or rewritten since: the grader turns a non-empty answer into the
integrity flag ``timer-tampering``, and checks every time against the GPU's physical limits in its own process
(:mod:`grader.speed.limits`).
"""

from __future__ import annotations

import builtins
import gc
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

# Normal-theory constants: IQR = 1.349 σ, and the standard error of a median is √(π/2)·σ/√n.
_IQR_PER_SIGMA = 1.349
_MEDIAN_SE = math.sqrt(math.pi / 2)


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def quantile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default, and ``triton.testing``'s)."""
    if not samples:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    data = sorted(samples)
    point = q * (len(data) - 1)
    lo, hi = math.floor(point), math.ceil(point)
    return data[lo] + (data[hi] - data[lo]) * (point - lo)


@dataclass(frozen=True)
class Stats:
    """Summary of one candidate's timings, in milliseconds."""

    n: int
    median: float
    mean: float
    stdev: float
    min: float
    max: float
    q1: float
    q3: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def cv(self) -> float:
        """Coefficient of variation (stdev / mean): the spread of single runs."""
        return self.stdev / self.mean if self.mean > 0 else 0.0

    @property
    def robust_cv(self) -> float:
        """The spread of single runs from the IQR (outliers do not move it)."""
        return self.iqr / _IQR_PER_SIGMA / self.median if self.median > 0 else 0.0

    @property
    def rel_se(self) -> float:
        """Relative standard error of the median: how well the median itself is known."""
        if self.n < 2:
            return math.inf
        return _MEDIAN_SE * self.robust_cv / math.sqrt(self.n)

    def to_dict(self) -> dict[str, float]:
        return {
            "n": self.n, "median": self.median, "mean": self.mean, "stdev": self.stdev,
            "min": self.min, "max": self.max, "q1": self.q1, "q3": self.q3,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> Stats:
        return cls(int(data["n"]), *(float(data[k]) for k in ("median", "mean", "stdev", "min", "max", "q1", "q3")))


def summarize(samples: Sequence[float]) -> Stats:
    if not samples:
        raise ValueError("no samples to summarize")
    data = sorted(float(s) for s in samples)
    return Stats(
        n=len(data),
        median=statistics.median(data),
        mean=statistics.fmean(data),
        stdev=statistics.stdev(data) if len(data) > 1 else 0.0,
        min=data[0],
        max=data[-1],
        q1=quantile(data, 0.25),
        q3=quantile(data, 0.75),
    )


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation of a few values (e.g. one ratio measured in several runs)."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else 0.0


@dataclass(frozen=True)
class StopRule:
    """When to stop adding rounds. ``check`` returns the reason to stop, or None to go on."""

    min_rounds: int = 20
    max_rounds: int = 2000
    rel_se: float = 0.003  # every median known to ±0.3 % (one standard error)
    budget_s: float = 2.0  # wall-clock seconds for the rounds (warm-up not counted)

    def __post_init__(self) -> None:
        if self.min_rounds < 1 or self.max_rounds < self.min_rounds:
            raise ValueError(f"need 1 <= min_rounds <= max_rounds, got {self.min_rounds}, {self.max_rounds}")
        if self.rel_se <= 0 or self.budget_s <= 0:
            raise ValueError("rel_se and budget_s must be positive")

    def check(self, samples: Mapping[str, Sequence[float]], elapsed_s: float) -> str | None:
        n = min((len(s) for s in samples.values()), default=0)
        if n == 0:
            return None
        if n >= self.max_rounds:
            return "max_rounds"
        if n >= self.min_rounds and all(summarize(s).rel_se <= self.rel_se for s in samples.values()):
            return "converged"
        # The budget never stops before a few rounds: the timed outputs of both input sets must be
        # re-checked at least once (a result left over from the previous call is caught there).
        if elapsed_s >= self.budget_s and n >= min(self.min_rounds, 3):
            return "budget"
        return None


# --------------------------------------------------------------------------------------------
# The primitives timing goes through, captured before student code can replace them
# --------------------------------------------------------------------------------------------

_CAPTURED: dict[str, tuple[Any, str, Any, Any]] = {}  # name -> (owner, attribute, object, its code)
_MISSING = object()


def _code(value: Any) -> Any:
    """The code object behind a function, method, property or class/static method (None for C callables)."""
    for inner in (value, getattr(value, "fget", None), getattr(value, "__func__", None)):
        code = getattr(inner, "__code__", None)
        if code is not None:
            return code
    return None


def _targets() -> dict[str, tuple[Any, str]]:
    """Everything a measurement calls: name -> (owner, attribute)."""
    import torch
    import triton.testing

    from grader.speed import measure

    this = sys.modules[__name__]
    found: dict[str, tuple[Any, str]] = {
        "time.perf_counter": (time, "perf_counter"), "time.monotonic": (time, "monotonic"), "time.time": (time, "time"),
        "torch.cuda.Event": (torch.cuda, "Event"), "torch.cuda.synchronize": (torch.cuda, "synchronize"),
        "torch.cuda._sleep": (torch.cuda, "_sleep"), "torch.cuda.current_stream": (torch.cuda, "current_stream"),
        "torch.cuda.CUDAGraph": (torch.cuda, "CUDAGraph"), "torch.cuda.graph": (torch.cuda, "graph"),
        "triton.testing.do_bench": (triton.testing, "do_bench"),
    }
    owners = {"torch.cuda.Event": torch.cuda.Event, "torch.cuda.CUDAGraph": torch.cuda.CUDAGraph,
              "torch._C._CudaEventBase": torch._C._CudaEventBase}
    for owner_name, owner in owners.items():
        for attr in ("record", "elapsed_time", "synchronize", "query", "replay", "__init__", "__new__"):
            if attr in vars(owner):
                found[f"{owner_name}.{attr}"] = (owner, attr)
    for attr in ("median", "fmean", "stdev"):
        found[f"statistics.{attr}"] = (statistics, attr)
    for attr in ("sorted", "min", "max", "sum", "len", "float", "int", "isinstance"):
        found[f"builtins.{attr}"] = (builtins, attr)
    for module, prefix in ((this, "grader.speed.timing"), (measure, "grader.speed.measure")):
        for attr, value in vars(module).items():
            if getattr(value, "__module__", None) == module.__name__ and (callable(value) or isinstance(value, type)):
                found[f"{prefix}.{attr}"] = (module, attr)
                if isinstance(value, type):
                    for member in vars(value):
                        if _code(vars(value)[member]) is not None:
                            found[f"{prefix}.{attr}.{member}"] = (value, member)
    return found


def capture_primitives() -> None:
    """Record the timing primitives as they are now. The grader's worker calls this before it imports
    any student module; :class:`CudaClock` then uses these objects and :func:`tampered` compares."""
    _CAPTURED.clear()
    for name, (owner, attr) in _targets().items():
        value = vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)
        _CAPTURED[name] = (owner, attr, value, _code(value))


def _primitive(name: str, current: Any) -> Any:
    """The captured object of that name, or ``current`` where nothing was captured (pytest, bench)."""
    return _CAPTURED[name][2] if name in _CAPTURED else current


def tampered() -> list[str]:
    """The captured primitives that were replaced, deleted or had their code rewritten since
    :func:`capture_primitives` (empty where nothing was captured)."""
    changed = []
    for name, (owner, attr, value, code) in _CAPTURED.items():
        now = vars(owner).get(attr, _MISSING) if isinstance(owner, type) else getattr(owner, attr, _MISSING)
        if now is not value or _code(now) is not code:
            changed.append(name)
    return changed


# --------------------------------------------------------------------------------------------
# Clocks
# --------------------------------------------------------------------------------------------


class Clock(Protocol):
    """What the engine needs from a device: flush caches, timestamps in stream order, a host
    clock for the budget, and (optionally) graph capture."""

    def flush(self) -> None: ...

    def hold(self, ms: float) -> None: ...

    def mark(self) -> Any: ...

    def elapsed_ms(self, start: Any, end: Any) -> float: ...

    def sync(self) -> None: ...

    def wall(self) -> float: ...

    def capture(self, fn: Callable[[], Any]) -> Callable[[], None] | None: ...


class CudaClock:
    """CUDA events on the current stream; L2 flushed by zeroing Triton's 256 MB benchmark buffer
    (larger than the L2 of an H100/H200, 50/60 MB); the GPU held with ``torch.cuda._sleep``, a spin
    of a given number of clock cycles. Uses the primitives :func:`capture_primitives` recorded, where
    it was called."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._event = _primitive("torch.cuda.Event", torch.cuda.Event)
        self._record = _primitive("torch.cuda.Event.record", torch.cuda.Event.record)
        self._elapsed = _primitive("torch.cuda.Event.elapsed_time", torch.cuda.Event.elapsed_time)
        self._synchronize = _primitive("torch.cuda.synchronize", torch.cuda.synchronize)
        self._sleep = _primitive("torch.cuda._sleep", torch.cuda._sleep)
        self._perf_counter = _primitive("time.perf_counter", time.perf_counter)
        # cycles per ms at the highest clock (kHz; 2.1 GHz where torch does not say, above any data-centre
        # GPU's boost clock): a hold is never shorter than asked, only longer at a lower clock
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self._cycles_per_ms = getattr(props, "clock_rate", 0) or 2_100_000
        try:
            import triton

            driver = triton.runtime.driver.active
            self._cache = driver.get_empty_cache_for_benchmark()
            self._clear = getattr(driver, "clear_cache", None) or (lambda buf: buf.zero_())
        except (ImportError, AttributeError, RuntimeError):  # an older/other Triton: same buffer by hand
            self._cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
            self._clear = lambda buf: buf.zero_()

    def flush(self) -> None:
        self._clear(self._cache)

    def hold(self, ms: float) -> None:
        if ms > 0:
            self._sleep(int(ms * self._cycles_per_ms))

    def mark(self) -> Any:
        event = self._event(enable_timing=True)
        self._record(event)
        return event

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return self._elapsed(start, end)

    def sync(self) -> None:
        self._synchronize()

    def wall(self) -> float:
        return self._perf_counter()

    def capture(self, fn: Callable[[], Any]) -> Callable[[], None] | None:
        """A CUDA graph of one call of ``fn``; None if the call cannot be captured (it syncs,
        reads a value on the host, ...)."""
        torch = self._torch
        graph = torch.cuda.CUDAGraph()
        # A Triton kernel finalized by the cyclic GC during capture would unload its module and
        # invalidate the graph (triton.testing.cuda_graph_without_gc).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph):
                fn()
        except Exception:
            torch.cuda.synchronize()
            return None
        finally:
            if gc_was_enabled:
                gc.enable()
        return graph.replay


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------

# The GPU is held this long before a timed call: HOLD_FACTOR × the candidate's launch time (host time
# from the call to its return, measured in the warm-up) plus HOLD_MIN_MS, at most HOLD_MAX_MS. A call
# that takes longer than that to launch (it synchronizes, say) has its launch gaps measured: say so.
HOLD_FACTOR = 1.5
HOLD_MIN_MS = 0.05
HOLD_MAX_MS = 5.0


@dataclass(frozen=True)
class Candidate:
    """One implementation to time. ``fn(inputs)`` is the timed call. ``check(output, set_index)``
    runs untimed after every call (warm-up included) and returns a problem, or None."""

    name: str
    fn: Callable[[dict[str, Any]], Any]
    check: Callable[[Any, int], str | None] | None = None


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


def measure(
    candidates: Sequence[Candidate],
    sources: Sequence[Mapping[str, Any]],
    *,
    clock: Clock,
    rule: StopRule = StopRule(),
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

    def checked(candidate: Candidate, output: Any, index: int) -> bool:
        if candidate.check is None:
            return True
        problem = candidate.check(output, index)
        if problem:
            result.problems.append(problem)
            result.stop = "problem"
            return False
        return True

    # 1. Warm-up: every input set once (compiles, and lets checks see each set's result), then a
    #    few timed calls per candidate to estimate its duration and its launch time, then warm-up until
    #    warmup_ms.
    warmup_start = clock.wall()
    for candidate in candidates:
        for index, source in enumerate(sources):
            output = _call(candidate, fresh_inputs(source))
            clock.sync()
            if not checked(candidate, output, index):
                return result
    estimates, holds = {}, {}
    for candidate in candidates:
        times, launches = [], []
        for k in range(3):
            inputs = fresh_inputs(sources[k % len(sources)])
            clock.flush()
            clock.hold(HOLD_MAX_MS)
            launched = clock.wall()
            start = clock.mark()
            _call(candidate, inputs)
            end = clock.mark()
            launches.append((clock.wall() - launched) * 1e3)
            clock.sync()
            times.append(clock.elapsed_ms(start, end))
        estimates[candidate.name] = max(statistics.median(times), 1e-6)
        hold = HOLD_FACTOR * statistics.median(launches) + HOLD_MIN_MS
        holds[candidate.name] = min(HOLD_MAX_MS, hold)
        if hold > HOLD_MAX_MS:
            result.notes.append(f"{candidate.name} takes {statistics.median(launches):.2f} ms to launch a call (does "
                                "it wait for the GPU?): its time includes the gaps while it launches")
        extra = min(100, int(warmup_ms / estimates[candidate.name]))
        for k in range(extra):
            _call(candidate, fresh_inputs(sources[k % len(sources)]))
        clock.sync()

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

    # 3. Rounds, with the stopping rule after each.
    started = clock.wall()
    round_index = 0
    while True:
        offset = round_index % len(candidates)
        order = candidates[offset:] + candidates[:offset]
        index = round_index % len(sources)
        pending = []
        for candidate in order:
            prepare, run = runners[candidate.name](index)
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
            if not checked(candidate, output, index):
                return result
        del pending
        round_index += 1
        reason = rule.check(result.samples, clock.wall() - started) if _should_check(round_index) else None
        if reason:
            result.stop = reason
            result.timed_s = clock.wall() - started
            return result


def _should_check(rounds: int) -> bool:
    # Summaries sort every sample list: check each round early on, then every 5th round.
    return rounds < 50 or rounds % 5 == 0


def _event_runner(candidate: Candidate, sources: Sequence[Mapping[str, Any]]):
    def runner(index: int):
        inputs = fresh_inputs(sources[index])  # before the flush: the copy does not stay in L2
        return inputs, lambda prepared: _call(candidate, prepared)

    return runner


def _capture_all(candidates, sources, clock: Clock) -> dict[str, Callable[[int], Any]]:
    runners = {}
    for candidate in candidates:
        static = fresh_inputs(sources[0])
        box: dict[str, Any] = {}

        def body(candidate=candidate, static=static, box=box):
            box["out"] = _call(candidate, static)

        replay = clock.capture(body)
        if replay is None:
            return {}

        def runner(index: int, static=static, replay=replay, box=box):
            refill(static, sources[index])

            def run(_prepared):
                replay()
                return box.get("out")

            return None, run

        runners[candidate.name] = runner
    return runners


# --------------------------------------------------------------------------------------------
# Roofline
# --------------------------------------------------------------------------------------------


@cache
def copy_bandwidth_gbps() -> float:
    """Device-to-device copy bandwidth (bytes read + written), 1 GiB, ``do_bench`` median."""
    import torch
    from triton.testing import do_bench

    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


@cache
def matmul_tflops(dtype: str) -> float:
    """Dense 8192³ ``torch.matmul`` rate for ``dtype`` (float32 with TF32, as ``tl.dot`` uses)."""
    import torch
    from triton.testing import do_bench

    from grader.checks.spec import DTYPES

    n = 8192
    a = torch.randn(n, n, device="cuda").to(DTYPES[dtype])
    b = torch.randn(n, n, device="cuda").to(DTYPES[dtype])
    was = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        ms = do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was
    return 2 * n**3 / (ms * 1e-3) / 1e12


def roofline(dtypes: Sequence[str] = ()) -> dict[str, Any]:
    """The measured roofs: copy bandwidth and, for each dtype, the matmul rate (cached per process)."""
    return {
        "copy_gbps": copy_bandwidth_gbps(),
        "matmul_tflops": {d: matmul_tflops(d) for d in sorted(set(dtypes))},
    }
