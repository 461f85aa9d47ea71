"""How a student's ``@triton.autotune`` chooses in the grader's worker.

Autotuning picks a config by timing every candidate: timed beside another student's work, it picks by noise,
and timed on every new shape of the correctness cases it costs seconds per case. So the worker runs the
autotuner in one of three modes (:func:`install` patches Triton's ``Autotuner``; pytest and ``grader bench``
leave it alone):

* ``FIRST`` (correctness checks): nothing is timed; each candidate, in the student's order and after the
  student's ``prune_configs_by``, is run once until one runs (a config Triton cannot build, e.g. too much shared
  memory, is skipped as the autotuner would skip it). Every config a student lists must be correct: another GPU
  could pick any of them.
* ``COMPILE`` (the speed warm-up, sharing the GPU): every candidate is compiled and run once, not timed. The
  candidates of a choice are compiled all at once, on threads (:func:`_compile_ahead`), then run one by one.
* ``TUNE`` (the speed recording): Triton's own autotuning, timing the candidates that are already compiled, with
  the GPU alone (:func:`grader.checks.gpu_gate.current`'s ``alone()``, taken when the first candidate is timed and
  given back when the autotuner has chosen; inside :func:`one_turn`, given back at the end of that block, so that
  a part's choices, one per benchmark and kernel, cost the other processes on the GPU one pause, not one each).
  Each candidate is timed briefly (:data:`TUNE_WARMUP_MS`, :data:`TUNE_REP_MS`), whatever benchmarker the student
  gave the autotuner: every millisecond of it is a millisecond every other process on the GPU waits. The
  candidates of a choice are timed side by side, in interleaved rounds (:func:`time_interleaved`), not one after
  the other as Triton does: the GPU's speed drifts while a choice is timed, and one after the other the first
  candidates and the last can meet different speeds (in batches, reference copies lost matmul credit to such picks).
  :func:`forget_untimed` first drops every choice made in the other modes. A choice timed by one of a student's
  workers is shared with the student's other workers (:mod:`grader.speed.autotune_choices`).

Choices made in ``FIRST``/``COMPILE`` are never written to Triton's on-disk autotune cache.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import types
import weakref
from collections.abc import Iterator
from typing import Any

from grader.checks import gpu_gate
from grader.speed.autotune_choices import choices_shared, shadowed

FIRST, COMPILE, TUNE = "first", "compile", "tune"
# Timing one candidate in TUNE mode, in ms (Triton's own default is 25 + 100). With the GPU alone and a choice's
# candidates interleaved, the runs that fit in 10 ms picked configs for the reference solutions that keep their
# speed credit; the workers' autotuning held the GPU alone half as long as with 5 + 25 ms, every other process on it
# waiting meanwhile (docs/decisions/0002-student-autotuning.md).
TUNE_WARMUP_MS, TUNE_REP_MS = 2, 10
# The rounds a choice's candidates are timed in, each candidate's calls spread evenly over them: a drift of the GPU's
# speed while a choice is timed (on an H200, one matmul config's median moved by up to 11 % from one 150 ms timing to
# the next) then moves every candidate alike, not the ones timed last (docs/decisions/0002-student-autotuning.md).
TUNE_ROUNDS = 10
# Threads compiling one choice's candidates at once. Triton's compiler leaves Python's lock while it works (its
# passes, ptxas), so they run side by side; a choice has a handful of candidates (the reference solutions: 4 to 7).
COMPILE_THREADS = 8
_FAILED = [float("inf")] * 3  # what Triton's own _bench returns for a config it cannot build
_CHOSEN = [0.0] * 3

# Process-wide, not per thread: PyTorch runs a CUDA backward pass on a thread of its autograd engine, and the
# student's autotuned backward kernels must choose in the mode of the request that called backward() (the worker
# runs one request at a time).
_state = types.SimpleNamespace()
_untimed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # autotuner -> keys chosen without timing
_default = TUNE
_installed = False


def _mode() -> str:
    return getattr(_state, "mode", _default)


@contextlib.contextmanager
def mode(name: str) -> Iterator[None]:
    """Run the block with the autotuner in mode ``name`` (this process: the threads it starts follow it)."""
    previous = getattr(_state, "mode", None)
    _state.mode = name
    try:
        yield
    finally:
        if previous is None:
            del _state.mode
        else:
            _state.mode = previous


@contextlib.contextmanager
def one_turn() -> Iterator[None]:
    """The block in ``TUNE`` mode, with one turn alone for all its autotuning: taken when the first candidate is
    timed (a block that times none asks for nothing), given back when the block ends."""
    with contextlib.ExitStack() as turn, mode(TUNE):
        _state.turn, _state.turn_taken = turn, False
        try:
            yield
        finally:
            _state.turn = None


def install(default: str = FIRST) -> bool:
    """Patch Triton's autotuner (once per process); False where this Triton's autotuner is not the one this
    module knows (then it autotunes as usual)."""
    global _default, _installed
    _default = default
    if _installed:
        return True
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return False
    run, bench = getattr(Autotuner, "run", None), getattr(Autotuner, "_bench", None)
    if run is None or bench is None:
        return False
    _original.update(run=run, bench=bench)
    Autotuner.run = _patched_run
    Autotuner._bench = _patched_bench
    _installed = True
    return True


_original: dict[str, Any] = {}  # Triton's own Autotuner.run and Autotuner._bench, which the patches call


def installed() -> str | None:
    """The default mode of the installed patch; None where Triton's autotuner is its own."""
    return _default if _installed else None


def uninstall() -> None:
    """Give Triton its own autotuner back (a process that installed the patch for a while: the tests), without
    the choices the patch made untimed (a kernel object kept by the process would run them where Triton would time
    its candidates). A later :func:`install` patches it again."""
    global _default, _installed
    forget_untimed()
    if _installed:
        from triton.runtime.autotuner import Autotuner

        Autotuner.run, Autotuner._bench = _original["run"], _original["bench"]
        _installed = False
    _default = TUNE


def _patched_run(self, *args, **kwargs):
    run = _original["run"]
    current = _mode()
    if current == TUNE:  # timing candidates takes the GPU alone (_patched_bench), until the choice is made
        with contextlib.ExitStack() as alone, choices_shared(self):
            _state.alone = alone
            try:
                return run(self, *args, **kwargs)
            finally:
                _state.alone = None
    cache = getattr(self, "cache", None)
    before = set(cache) if isinstance(cache, dict) else set()
    saved = getattr(self, "cache_results", False)
    self.cache_results = False  # an untimed choice never reaches the on-disk autotune cache
    self._grader_found = False
    try:
        with _candidates_seen(self) if current == COMPILE else contextlib.nullcontext():
            return run(self, *args, **kwargs)
    finally:
        self.cache_results = saved
        if isinstance(cache, dict):
            _untimed.setdefault(self, set()).update(set(cache) - before)


def _patched_bench(self, *args, config, **meta):
    bench = _original["bench"]
    current = _mode()
    if current == TUNE and getattr(self, "_grader_shared", None) is not None:
        return _CHOSEN  # the one candidate left is another worker's timed choice: nothing to time
    if current == TUNE:
        _hold_the_gpu_alone()
        return _timed_side_by_side(self, bench, args, config, meta)
    if current == FIRST and getattr(self, "_grader_found", False):
        return _FAILED  # a runnable config was found: the others are neither built nor run
    if current == COMPILE:
        candidates, self._grader_candidates = getattr(self, "_grader_candidates", None), None
        if candidates:  # the first candidate of the choice: compile them all now, at once
            _compile_ahead(self, args, meta, candidates)
    with _benchmarker(self, _run_once):
        result = bench(self, *args, config=config, **meta)
    if result == _FAILED:
        return result
    self._grader_found = True
    return _CHOSEN


def _hold_the_gpu_alone() -> None:
    """Timing a choice's candidates holds the GPU alone: once per turn where one is open, else once per choice."""
    turn = getattr(_state, "turn", None)
    if turn is not None:
        if not _state.turn_taken:
            turn.enter_context(gpu_gate.current().alone())
            _state.turn_taken = True
        return
    alone = getattr(_state, "alone", None)
    if alone is not None:
        alone.enter_context(gpu_gate.current().alone())
        _state.alone = None  # once per choice


@contextlib.contextmanager
def _candidates_seen(tuner) -> Iterator[None]:
    """In the block, the candidates ``tuner`` keeps after the student's pruning are left in
    ``tuner._grader_candidates`` for :func:`_compile_ahead` (the autotuner prunes once per choice)."""
    prune = tuner.prune_configs

    def prune_and_keep(*args, **kwargs):
        configs = prune(*args, **kwargs)
        tuner._grader_candidates = list(configs) if len(configs) > 1 else None
        return configs

    try:
        with shadowed(tuner, "prune_configs", prune_and_keep):
            yield
    finally:
        tuner._grader_candidates = None


def _compile_ahead(tuner, args: tuple, meta: dict, candidates: list) -> None:
    """Compile every candidate of one choice of ``tuner`` at once, on threads, with Triton's asynchronous
    compilation: each candidate's arguments are bound here, one after the other (after its ``pre_hook``, which may
    change them: a tensor descriptor's block shape is part of the kernel's signature), and compiled on a thread.
    The autotuner then runs the candidates one by one from the compiled kernels. A candidate that fails to compile
    is left to it: it compiles it again, meets the error and skips it as usual. Not in the interpreter (nothing to
    compile there) nor where Triton has no asynchronous compilation."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return
    kernel = tuner.fn
    while not isinstance(kernel, InterpretedFunction) and hasattr(kernel, "fn") and hasattr(kernel.fn, "run"):
        kernel = kernel.fn  # through the student's @triton.heuristics, to the kernel itself
    if isinstance(kernel, InterpretedFunction):
        return
    with concurrent.futures.ThreadPoolExecutor(min(len(candidates), COMPILE_THREADS),
                                               thread_name_prefix="compile") as threads:
        compiling = AsyncCompileMode(threads, ignore_errors=True)
        try:
            compiling.__enter__()
        except RuntimeError:  # the student's own asynchronous compilation is under way: compile one by one
            return
        try:
            for config in candidates:
                current = {**meta, **config.all_kwargs(), "warmup": True}
                try:
                    if config.pre_hook:
                        config.pre_hook({**tuner.nargs, **current})
                    tuner.fn.run(*args, **current)
                except Exception:  # met again, and reported, when the autotuner runs this candidate
                    continue
        finally:
            with gpu_gate.current().released():  # waiting for the compiler is not GPU work: nobody waits for it
                compiling.__exit__(None, None, None)


def _benchmarker(tuner, bench) -> contextlib.AbstractContextManager:
    """Triton's autotuner ``tuner`` times its candidates with ``bench`` in the block."""
    return shadowed(tuner, "do_bench", bench)  # do_bench is a cached property: the instance's entry shadows it


def _run_once(kernel_call, quantiles=None, **_ignored):
    kernel_call()
    return _CHOSEN


def _timed_side_by_side(tuner, bench, args: tuple, config, meta: dict) -> list[float]:
    """The timing of candidate ``config`` of the choice ``tuner`` is making (Triton asks for one candidate at a
    time): at the choice's first candidate, every candidate is timed at once (:func:`time_interleaved`), each call
    built by Triton's own ``_bench`` (its pre-hooks and restored arguments included); the others are answered from
    those timings."""
    timed = getattr(tuner, "_grader_timed", None) or {}
    if id(config) not in timed:  # the choice's first candidate (or one its pruning did not list: timed alone)
        listed = getattr(tuner, "_grader_tuning", None) or ()
        candidates = [c for c in listed if id(c) not in timed] if any(c is config for c in listed) else [config]
        calls: list = []
        with _benchmarker(tuner, lambda kernel_call, **_ignored: calls.append(kernel_call) or _CHOSEN):
            for candidate in candidates:
                bench(tuner, *args, config=candidate, **meta)
        timed.update(zip(map(id, candidates), time_interleaved(calls)))
        tuner._grader_timed = timed
    return timed[id(config)]


def time_interleaved(calls: list, *, warmup_ms: float = TUNE_WARMUP_MS, rep_ms: float = TUNE_REP_MS,
                     rounds: int = TUNE_ROUNDS, device=None) -> list[list[float]]:
    """Time each of ``calls`` (the candidates of one choice) as ``triton.testing.do_bench`` would (a first call, an
    estimate from 5 calls, ``warmup_ms`` of calls, then the calls that fit in ``rep_ms``, each after the L2 cache
    is cleared, timed by device events), but side by side: the timed calls in ``rounds`` rounds (fewer where a
    candidate has fewer calls), each round a slice of every candidate's calls, in an order rotated from round to
    round. Returns each candidate's median, 20th and 80th percentile in ms, or infinities for a candidate Triton
    cannot build or launch (as its autotuner skips it). ``device`` (tests): the events, synchronization and cache
    clearing; default Triton's active driver."""
    from grader.speed.stats import quantile

    device, rounds = device if device is not None else _TritonDevice(), max(1, rounds)
    results = [list(_FAILED) for _ in calls]
    live = []
    for k, call in enumerate(calls):
        try:
            call()
        except _build_failures():  # as Triton's own _bench: the autotuner skips this candidate
            continue
        live.append(k)
    device.synchronize()
    runs: dict[int, int] = {}
    for k in live:  # the estimate of each candidate's time (do_bench's: 5 calls, each after the cache is cleared)
        start, end = device.event(), device.event()
        start.record()
        for _ in range(5):
            device.clear_cache()
            calls[k]()
        end.record()
        device.synchronize()
        estimate = max(start.elapsed_time(end) / 5, 1e-6)
        for _ in range(max(1, int(warmup_ms / estimate))):
            calls[k]()
        runs[k] = max(1, int(rep_ms / estimate))
    # every candidate in every round: no more rounds than the fewest calls a candidate has (a slow kernel's 10 ms)
    rounds = min([rounds, *runs.values()])
    samples: dict[int, list[float]] = {k: [] for k in live}
    for r in range(rounds) if live else ():
        timed = []
        for k in live[r % len(live):] + live[:r % len(live)]:
            share = runs[k] // rounds + (1 if r < runs[k] % rounds else 0)  # the calls spread evenly
            for _ in range(share):
                start, end = device.event(), device.event()
                device.clear_cache()
                start.record()
                calls[k]()
                end.record()
                timed.append((k, start, end))
        device.synchronize()
        for k, start, end in timed:
            samples[k].append(start.elapsed_time(end))
    for k in live:
        results[k] = [quantile(samples[k], q) for q in (0.5, 0.2, 0.8)]
    return results


def _build_failures() -> tuple[type[BaseException], ...]:
    """What Triton's autotuner catches from a candidate's call: a config it cannot build (too much shared memory, a
    failed static assertion, ptxas)."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError

    return OutOfResources, CompileTimeAssertionFailure, PTXASError


class _TritonDevice:
    """The events, synchronization and L2 cache clearing of ``triton.testing.do_bench``, from Triton's active
    driver."""

    def __init__(self) -> None:
        from triton import runtime

        self._driver = runtime.driver.active
        self._interface = self._driver.get_device_interface()
        self._cache = self._driver.get_empty_cache_for_benchmark()

    def event(self):
        return self._interface.Event(enable_timing=True)

    def synchronize(self) -> None:
        self._interface.synchronize()

    def clear_cache(self) -> None:
        self._driver.clear_cache(self._cache)


def forget_untimed() -> int:
    """Drop every choice made without timing, so that the next call autotunes for real; how many."""
    dropped = 0
    for tuner, keys in list(_untimed.items()):
        cache = getattr(tuner, "cache", None)
        for key in keys:
            if isinstance(cache, dict) and cache.pop(key, None) is not None:
                dropped += 1
        keys.clear()
    return dropped
