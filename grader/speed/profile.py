"""``grader profile EXERCISE [--impl PATH] [--part NAME] [--benchmark LABEL] [--trace FILE]``: where a call's time
goes, as the course teaches it — every kernel one call launches, beside the reference and PyTorch.

For one case of each part, each candidate — yours, the reference solution (where this checkout has
``solutions/``), the part's PyTorch baselines and its unfused PyTorch version — is called once to warm up (Triton
compiles and autotunes then), then once more while :func:`.launches.record` watches:

* every Triton launch (``JITFunction.run``, or ``InterpretedFunction.run`` in the interpreter): the kernel's
  name, its grid, and the bytes of the tensors it is handed (each storage once: all it can read or write);
* every PyTorch op outside those launches that does work (views, allocations and metadata queries do none): on a
  GPU each is one kernel or more of its own, with its own round trip to memory.

On a GPU, :data:`.launches.PROFILED_CALLS` more calls run under ``torch.profiler``, each after an L2 flush and
queued whole before the GPU reaches it, as ``grader bench`` times a call, and each launch gets its median GPU time
(``--trace`` writes the profiler's Chrome/Perfetto trace). On a CPU the kernels run in the Triton interpreter,
whose times say nothing about a GPU: the launches, grids and bytes hold there, the times need a GPU. A short reading
says in plain words what the tables show: how many launches each candidate makes, and which bytes a later kernel
touches again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grader import exercises
from grader.checks import loader, runtime
from grader.checks.integrity import tensors_in
from grader.checks.spec import Case, Exercise, Part
from grader.checks.text import plural
from grader.speed.launches import PROFILED_CALLS, CallProfile, Launch, profile_call

YOURS, REFERENCE, UNFUSED = "yours", "reference", "torch (unfused)"
CPU_MAX_ELEMENTS = 1 << 15  # the interpreter runs a case of this size in about a second
CPU_NOTE = ("times need a GPU: here the kernels ran in the Triton interpreter, whose speed says nothing about a GPU "
            "(launches, grids and bytes hold as shown)")


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
        profiles.append(profile_call(name, call, inputs, device=device, trace=trace, compiled="compile" in name))
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


def gpu_caption(profile: CallProfile) -> str:
    """The call's GPU time under its table: the kernels added up, and the call's span where kernels on several
    streams overlapped (the span is what ``grader bench`` times)."""
    text = f"the call's kernels: {profile.gpu_ms * 1e3:.1f} µs of GPU time in all"
    if profile.span_ms is not None and profile.span_ms < 0.98 * profile.gpu_ms:
        text += (f"; the call spans {profile.span_ms * 1e3:.1f} µs on the GPU: its kernels overlap (run on "
                 "several streams at once)")
    return text + (f" (median of {PROFILED_CALLS} calls, each after an L2 flush and queued whole, as `grader bench` "
                   "times a call)")


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
            table.caption = gpu_caption(profile)
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
