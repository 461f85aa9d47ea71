"""``grader profile EXERCISE [--impl PATH] [--part NAME] [--benchmark LABEL] [--trace FILE]``: where a call's time
goes, as the course teaches it — every kernel one call launches, beside the reference and PyTorch.

For one case of each part, each candidate — yours, the reference solution (where this checkout has
``solutions/``), the part's PyTorch baselines and its unfused PyTorch version — is called once to warm up (Triton
compiles and autotunes then), then once more while :func:`record` watches:

* every Triton launch (``JITFunction.run``, or ``InterpretedFunction.run`` in the interpreter): the kernel's
  name, its grid, and the bytes of the tensors it is handed (each storage once: all it can read or write);
* every PyTorch op outside those launches that does work (views, allocations and metadata queries do none): on a
  GPU each is one kernel or more of its own, with its own round trip to memory.

On a GPU the second call also runs under ``torch.profiler`` and each launch gets its GPU time (``--trace`` writes
the profiler's Chrome/Perfetto trace). On a CPU the kernels run in the Triton interpreter, whose times say nothing
about a GPU: the launches, grids and bytes hold there, the times need a GPU. A short reading says in plain words
what the tables show: how many launches each candidate makes, and which bytes a later kernel touches again.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grader import exercises
from grader.checks import loader, runtime
from grader.checks.execute import device_inputs
from grader.checks.integrity import tensors_in
from grader.checks.spec import Case, Exercise, Part
from grader.checks.text import plural
from grader.speed.recorder import NO_WORK_OPS

YOURS, REFERENCE, UNFUSED = "yours", "reference", "torch (unfused)"
CPU_MAX_ELEMENTS = 1 << 15  # the interpreter runs a case of this size in about a second
CPU_NOTE = ("times need a GPU: here the kernels ran in the Triton interpreter, whose speed says nothing about a GPU "
            "(launches, grids and bytes hold as shown)")


@dataclass
class Launch:
    """One kernel launch of a call: a Triton kernel, or a PyTorch op (one or more kernels of its own on a GPU)."""

    kind: str  # "triton" | "torch" | "kernel" (seen only by the GPU's profiler: no grid or bytes)
    name: str
    grid: tuple[int, ...] | None
    storages: dict[int, int] = field(default_factory=dict, repr=False)  # the tensors it was handed: address -> bytes
    ms: float | None = None  # GPU time, where measured

    @property
    def nbytes(self) -> int:
        """The bytes of the tensors it was handed, each storage once: all it can read or write."""
        return sum(self.storages.values())


@dataclass
class CallProfile:
    """What one call of a candidate launched; ``error`` where the call failed."""

    candidate: str
    launches: list[Launch] = field(default_factory=list)
    error: str | None = None
    gpu_ms: float | None = None  # every kernel of the call, on a GPU


# ----------------------------------------------------------------------------------------------------- recording


def _storages(values) -> dict[int, int]:
    """Storage address -> bytes of the tensors among ``values``."""
    found = {}
    for t in tensors_in(values):
        if t.device.type != "meta":
            storage = t.untyped_storage()
            found.setdefault(storage.data_ptr(), storage.nbytes())
    return found


def _grid(grid: Any, arg_names: list[str], args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    """The launch's grid as numbers (a callable grid is given the launch's arguments by name, as Triton does)."""
    if callable(grid):
        try:
            grid = grid({**dict(zip(arg_names, args, strict=False)), **kwargs})
        except Exception:  # a grid function that needs what only Triton's launcher knows: say nothing
            return None
    try:
        return tuple(int(g) for g in grid)
    except (TypeError, ValueError):
        return None


class _Ops(TorchDispatchMode):
    """PyTorch ops that do work, outside Triton launches."""

    def __init__(self, found: list[Launch]):
        super().__init__()
        self.found = found
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if not self.paused and name not in NO_WORK_OPS:
            touched = _storages([*args, *kwargs.values(), *(out if isinstance(out, tuple | list) else [out])])
            self.found.append(Launch("torch", name, None, touched))
        return out


@contextlib.contextmanager
def record() -> Iterator[list[Launch]]:
    """The launches made inside the ``with`` block, in order."""
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    found: list[Launch] = []
    ops = _Ops(found)
    originals = {cls: cls.__dict__["run"] for cls in classes if "run" in cls.__dict__}

    def wrap(original):
        def run(self, *args, grid, warmup, **kwargs):
            if not warmup:
                found.append(Launch("triton", getattr(self.fn, "__name__", "?"),
                                    _grid(grid, list(self.arg_names), args, kwargs),
                                    _storages([*args, *kwargs.values()])))
            ops.paused += 1  # what a launch does on the host (the interpreter's copies) is not the call's work
            try:
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                ops.paused -= 1

        return run

    for cls, original in originals.items():
        cls.run = wrap(original)
    try:
        with ops:
            yield found
    finally:
        for cls, original in originals.items():
            cls.run = original


def _gpu_times(launches: list[Launch], kernels: list[tuple[str, float]]) -> None:
    """Give each launch the GPU time of its kernel, from the profiler's kernels in launch order: a Triton launch
    takes the next kernel of its name; a PyTorch op the next kernel that is no Triton launch's (an op that launches
    several shows the first; the total counts them all)."""
    triton_names = {launch.name for launch in launches if launch.kind == "triton"}
    taken = [False] * len(kernels)
    for launch in launches:
        for i, (name, ms) in enumerate(kernels):
            mine = name == launch.name if launch.kind != "torch" else name not in triton_names
            if not taken[i] and mine:
                taken[i], launch.ms = True, ms
                break


def profile_call(name: str, call: Callable[[Any], Any], inputs: dict, *, device: str,
                 trace: Path | None = None) -> CallProfile:
    """Warm ``call`` up on ``inputs``, then record the launches of one more call (timed on a GPU)."""
    result = CallProfile(name)
    try:
        call(device_inputs(inputs, device))  # compiles and autotunes: not the call's own launches
        fresh = device_inputs(inputs, device)
        if device != "cuda":
            with record() as found:
                call(fresh)
            result.launches = list(found)
            return result
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof, record() as found:
            call(fresh)
            torch.cuda.synchronize()
        result.launches = list(found)
        kernels = [(e.name, e.device_time / 1e3) for e in prof.events()
                   if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and e.device_time > 0]
        if not result.launches:  # launched past Triton's and PyTorch's dispatch (Inductor's own launcher): the GPU's
            result.launches = [Launch("kernel", name, None, ms=ms) for name, ms in kernels]
        _gpu_times(result.launches, kernels)
        result.gpu_ms = sum(ms for _, ms in kernels)
        if trace is not None:
            prof.export_chrome_trace(str(trace.with_name(f"{trace.stem}-{_slug(name)}{trace.suffix}")))
    except Exception as exc:  # the student's call (or a baseline) failed: that is the candidate's result
        result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return result


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


# ------------------------------------------------------------------------------------------------------ the part


def candidates(part: Part, module, reference, device: str) -> list[tuple[str, Callable[[Any], Any] | None, str]]:
    """(name, call, why it is not run) for each candidate of ``part``."""
    found: list[tuple[str, Callable[[Any], Any] | None, str]] = [(YOURS, lambda inp: part.call(module, inp), "")]
    if reference is not None:
        found.append((REFERENCE, lambda inp: part.call(reference, inp), ""))
    for name, baseline in part.baselines.items():
        if name == "copy":
            continue  # a yardstick of bandwidth, not an implementation
        if "compile" in name and device != "cuda":
            found.append((name, None, "torch.compile on a CPU builds C++ loops, not the GPU's kernels"))
            continue
        if name != "torch" and device != "cuda":
            found.append((name, None, "a GPU library's kernels; on a CPU it would run others"))
            continue
        found.append((name, baseline, ""))
    if part.unfused is not None:
        found.append((UNFUSED, part.unfused, ""))
    return found


def profile_case(part: Part, device: str, label: str | None) -> tuple[Case, str]:
    """The case to profile and how to name it: the benchmark ``label`` (default the first) on a GPU; on a CPU the
    example most like it (the same options: activation, causal, layouts, dtype), of those the largest of at most
    :data:`CPU_MAX_ELEMENTS` elements, or the smallest (benchmark sizes would take the interpreter minutes; a kernel
    launches the same way at any size of its path)."""
    bench = None
    if part.benchmarks:
        bench = next((b for b in part.benchmarks if b.label == label), None) if label else part.benchmarks[0]
        if bench is None:
            raise KeyError(f"{part.name} has no benchmark {label} (has: {', '.join(b.label for b in part.benchmarks)})")
        if device == "cuda":
            return bench.case, f"benchmark {bench.label}"
    runnable = [c for c in part.examples if part.skip(c, device) is None] or list(part.examples)
    sizes = {c.label: sum(t.numel() for t in tensors_in(part.make_inputs(c).values())) for c in runnable}
    like = bench.case.params if bench is not None else {}  # the benchmark's options, where examples vary

    def alike(c: Case) -> float:
        """The benchmark's options this example shares (its sizes aside; a dtype changes no launch: half)."""
        return sum(0.5 if k == "dtype" else 1.0 for k, v in like.items()
                   if not isinstance(v, int | float) or isinstance(v, bool) if c.get(k) == v)

    def small(c: Case) -> tuple[bool, int]:  # the largest under the cap, else the smallest over it
        fits = sizes[c.label] <= CPU_MAX_ELEMENTS
        return fits, sizes[c.label] if fits else -sizes[c.label]

    case = max(runnable, key=lambda c: (alike(c), *small(c)))
    return case, f"example {case.label}" + (f" (on a CPU, like benchmark {bench.label}: its size needs a GPU)"
                                            if bench is not None else "")


def size_text(nbytes: float) -> str:
    """``1.5 MiB``, ``12.0 KiB``, ``96 B``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def profile_part(part: Part, module, reference, *, device: str, label: str | None = None,
                 trace: Path | None = None) -> tuple[str, list[CallProfile], list[str]]:
    """The part's case, each candidate's profile, and the candidates not run (with why)."""
    case, case_name = profile_case(part, device, label)
    inputs = part.make_inputs(case)
    profiles, skipped = [], []
    for name, call, why in candidates(part, module, reference, device):
        if call is None:
            skipped.append(f"{name}: {why}")
            continue
        profiles.append(profile_call(name, call, inputs, device=device, trace=trace))
    return case_name, profiles, skipped


# ----------------------------------------------------------------------------------------------- the reading


def reread_bytes(launches: list[Launch]) -> list[tuple[int, int, int]]:
    """(later launch, earlier launch, bytes) for each launch handed storage that an earlier one was: another pass
    over memory the earlier one already made (the first earlier launch it shares with is named)."""
    found = []
    for i, launch in enumerate(launches):
        seen: set[int] = set()
        for earlier in launches[:i]:
            seen |= earlier.storages.keys()
        shared = launch.storages.keys() & seen
        if shared:
            j = next(j for j in range(i) if launches[j].storages.keys() & shared)
            found.append((i, j, sum(launch.storages[s] for s in shared)))
    return found


def reading(profiles: list[CallProfile]) -> list[str]:
    """What the tables say, in plain words."""
    by_name = {p.candidate: p for p in profiles if p.error is None}
    lines = []
    yours = by_name.get(YOURS)
    if yours is None:
        failed = next((p for p in profiles if p.candidate == YOURS), None)
        return [f"your call failed: {failed.error}"] if failed is not None else []
    n = len(yours.launches)
    triton = sum(1 for x in yours.launches if x.kind == "triton")
    torch_ops = n - triton
    what = plural(triton, "Triton kernel") + (f" and {plural(torch_ops, 'PyTorch op')}" if torch_ops else "")
    lines.append(f"your call launches {what}")
    reference = by_name.get(REFERENCE)
    if reference is not None:
        m = len(reference.launches)
        compare = "the same number" if m == n else f"{n - m} fewer" if m < n else f"{m - n} more"
        lines.append(f"the reference launches {plural(m, 'kernel')} ({compare}"
                     + (")" if m == n else " than yours)"))
        if m < n:
            lines.append(f"each of your {n - m} extra launches is another pass over memory: fuse them into one "
                         "kernel that reads each input once and writes each output once")
    for other in (p for p in by_name.values() if p.candidate not in (YOURS, REFERENCE)):
        k = len(other.launches)
        saved = k - n
        tail = (f": fusing saves {plural(saved, 'round trip')} to global memory" if saved > 0 else "")
        lines.append(f"{other.candidate} launches {plural(k, 'kernel')}{tail}")
    for i, j, nbytes in reread_bytes(yours.launches):
        a, b = yours.launches[j], yours.launches[i]
        lines.append(f"your launch {i + 1} ({b.name}) is handed again {size_text(nbytes)} that launch {j + 1} "
                     f"({a.name}) already had: another pass over that memory")
    return lines


# ------------------------------------------------------------------------------------------------- the command


def render(title: str, case_name: str, profiles: list[CallProfile], skipped: list[str], *, device: str,
           console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console() if sys.stdout.isatty() else Console(width=160)
    console.print(f"[bold]{title}[/bold] — {case_name}")
    for profile in profiles:
        if profile.error:
            console.print(f"  {profile.candidate}: [red]failed[/red] — {profile.error}")
            continue
        table = Table(title=f"{profile.candidate}: {plural(len(profile.launches), 'launch', 'launches')} per call")
        for header, justify in (("#", "right"), ("kind", "left"), ("kernel", "left"), ("grid", "left"),
                                ("tensors", "right"), ("time", "right")):
            table.add_column(header, justify=justify)
        for n, launch in enumerate(profile.launches, 1):
            grid = "×".join(map(str, launch.grid)) if launch.grid else ""
            time = f"{launch.ms * 1e3:.1f} µs" if launch.ms is not None else "–"
            table.add_row(str(n), launch.kind, launch.name, grid, size_text(launch.nbytes), time)
        if profile.gpu_ms is not None:
            table.caption = f"the call's kernels: {profile.gpu_ms * 1e3:.1f} µs of GPU time in all"
        console.print(table)
    for line in skipped:
        console.print(f"  not profiled: {line}")
    for line in reading(profiles):
        console.print(f"  · {line}")
    if device != "cuda":
        console.print(f"  {CPU_NOTE}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("exercise", help="exercise name (grader list shows them)")
    parser.add_argument("--impl", default="assignments", help="implementation tree (default: assignments)")
    parser.add_argument("--part", default=None, help="only this part (default: every part)")
    parser.add_argument("--benchmark", default=None, metavar="LABEL",
                        help="the benchmark to profile (default: each part's first); on a CPU, the example most "
                             "like it")
    parser.add_argument("--trace", default=None, metavar="FILE.json",
                        help="on a GPU: write the profiler's Chrome/Perfetto trace, one file per candidate")


def _reference(exercise: Exercise, functions: tuple[str, ...]):
    """The reference solution's module where this checkout has solutions/ (a student release has none)."""
    import grader

    root = Path(grader.__file__).resolve().parent.parent / "solutions"
    try:
        return loader.load(root, exercise, functions)
    except loader.LoadError:
        return None


def run(args: argparse.Namespace) -> int:
    mode = runtime.configure()
    try:
        exercise = exercises.get(args.exercise)
        parts = [exercise.part(args.part)] if args.part else list(exercise.parts)
    except KeyError as exc:
        print(f"grader profile: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.trace and not mode.is_cuda:
        print("grader profile: --trace needs a GPU (here kernels run in the Triton interpreter)", file=sys.stderr)
        return 2
    functions = tuple(f for p in parts for f in p.functions)
    try:
        module = loader.load(Path(args.impl), exercise, functions)
    except loader.LoadError as exc:
        print(f"grader profile: {exc}", file=sys.stderr)
        return 2
    reference = _reference(exercise, functions)
    print(f"grader profile {exercise.name} --impl {args.impl}: {mode.description}")
    for part in parts:
        try:
            case_name, profiles, skipped = profile_part(part, module, reference, device=mode.device,
                                                        label=args.benchmark,
                                                        trace=Path(args.trace) if args.trace else None)
        except KeyError as exc:
            print(f"grader profile: {exc.args[0]}", file=sys.stderr)
            return 2
        render(f"{exercise.name} · {part.name}", case_name, profiles, skipped, device=mode.device)
    return 0
