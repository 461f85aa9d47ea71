"""``grader bench EXERCISE [--impl PATH] [--plot FILE]``: your kernel against the baselines, on the GPU.

For every benchmark size of every part (or ``--part``, ``--benchmark``), the student's kernel and all the
part's baselines (PyTorch native, ``torch.compile``, SDPA / cuBLAS, a device copy: whatever the part declares)
are timed side by side (:mod:`grader.speed.trusted`: the student's call is recorded once and its kernels are
replayed without its Python, as the grader times them; fresh inputs, L2 flushed, medians), and a table shows
time, spread, achieved GB/s and TFLOP/s, the percentage of the roofline (the time the measured copy
bandwidth and matmul rate allow, over the time taken), the speed relative to the part's speed baseline,
how many times faster yours is than each baseline, and the speed credit. ``--rounds N`` repeats each
measurement N times and reports the median of the N medians (the spread column is then the spread between
rounds). ``--plot FILE`` draws the roofline chart of the same numbers (the one the grade report shows) to an
SVG file or an HTML page.

``--leaderboard`` measures an exercise's leaderboard case; for ``flash_attention`` that is the CS336 one:
1 × 16 heads, N = 16384, D = 64, causal, bf16, forward + backward, against SDPA's FlashAttention-2 and cuDNN
backends, as the median of 5 rounds.

``--in-process`` also times the student's call itself (Python, launches and all) in the same rounds, to
compare the replayed time with the call's own.

This is the course's lesson "kernel benchmarking and profiling", made runnable: a kernel far below
the roofline is leaving bandwidth or tensor-core time on the table, and the table says which.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader import exercises
from grader.checks import loader, runtime
from grader.checks.spec import Benchmark, Exercise, Part
from grader.checks.verdicts import Verdict
from grader.speed import (
    credit,
    credit_messages,
    measure,
    probes,
    roofline,
    stats,
    student_calls,
    workload,
)
from grader.speed.in_process import measure_replayed
from grader.speed.thresholds import calibrated, speed_curves

YOURS = "yours"
IN_PROCESS = "yours (in-process)"  # --in-process: the student's call itself, timed beside its replay
PLOT_SUFFIXES = (".svg", ".html")


@dataclass(frozen=True)
class Leaderboard:
    part: str
    benchmark: str
    baselines: tuple[str, ...]
    rounds: int
    description: str


LEADERBOARDS = {
    "flash_attention": Leaderboard(
        "autograd", "cs336-h16-n16384-d64-causal", ("sdpa-flash", "sdpa-cudnn"), 5,
        "CS336 leaderboard: 1 × 16 heads, N = 16384, D = 64, causal, bf16, forward + backward"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("exercise", help="exercise name (see `grader list`)")
    parser.add_argument("--impl", default="assignments", metavar="PATH",
                        help="implementation tree laid out like assignments/ (default: assignments; "
                             "'solutions' benchmarks the reference)")
    parser.add_argument("--part", default=None, help="only this part (default: every part with benchmarks)")
    parser.add_argument("--benchmark", action="append", default=None, metavar="LABEL",
                        help="only this benchmark size (repeatable; default: all the part declares)")
    parser.add_argument("--baselines", default=None, metavar="A,B",
                        help="comma-separated baselines to time (default: all the part declares)")
    parser.add_argument("--budget-s", type=float, default=1.0, help="seconds of timing per benchmark (default: 1)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="measure each benchmark this many times and report the median of the medians "
                             "(default: 1; --leaderboard: 5)")
    parser.add_argument("--leaderboard", action="store_true",
                        help="the exercise's leaderboard case only (flash_attention: "
                             f"{LEADERBOARDS['flash_attention'].description})")
    parser.add_argument("--plot", default=None, metavar="FILE",
                        help="also draw the roofline chart: FILE.svg (an SVG image) or FILE.html (a page)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--course", default=None, metavar="COURSE.toml",
                        help="show the credit with this course file's [speed_curve] (default: $GRADER_COURSE, else "
                        "the GPU's calibrated thresholds)")
    parser.add_argument("--in-process", action="store_true",
                        help=f"also time your call itself, Python and all, as {IN_PROCESS!r} in the same rounds "
                             "(the grader times only your kernels, replayed)")


def _parts(exercise: Exercise, name: str | None) -> list[Part]:
    if name:
        return [exercise.part(name)]
    return [p for p in exercise.parts if p.benchmarks]


def _benchmarks(part: Part, labels: list[str] | None) -> list[Benchmark]:
    if not labels:
        return list(part.benchmarks)
    known = {b.label: b for b in part.benchmarks}
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise KeyError(f"{part.name} has no benchmark {', '.join(unknown)} (has: {', '.join(known)})")
    return [known[label] for label in labels]


def combine_rounds(rows: list[measure.BenchmarkTiming]) -> measure.BenchmarkTiming:
    """One row from repeated measurements of a benchmark: per candidate, the statistics of its round medians."""
    if len(rows) == 1 or any(r.error for r in rows):
        return next((r for r in rows if r.error), rows[0])
    names = [n for n in rows[0].times if all(n in r.times for r in rows)]
    return measure.BenchmarkTiming(
        rows[0].label, {n: stats.summarize([r.median(n) for r in rows]) for n in names}, rows[0].mode,
        f"{len(rows)} rounds", sum(r.rounds for r in rows), [note for r in rows for note in r.notes])


def measure_part_table(exercise: Exercise, part: Part, module, *, baselines: list[str] | None, budget_s: float,
                       benchmarks: list[Benchmark] | None = None, rounds: int = 1, in_process: bool = False,
                       log=print) -> dict[str, Any]:
    """The part's benchmarks: {"exercise", "part", "gpu", "roofline", "baseline", "rows", "rounds_ms"}; with
    ``rounds`` > 1 every benchmark is measured that many times (``rounds_ms``: each candidate's medians).
    ``in_process``: the student's own call is timed too, as :data:`IN_PROCESS`."""
    import torch

    extra = {IN_PROCESS: student_calls.student_call(part, module)} if in_process else None
    names = list(part.baselines) if baselines is None else [b for b in baselines if b in part.baselines]
    if part.speed_baseline and part.speed_baseline not in names:
        names.insert(0, part.speed_baseline)
    benchmarks = list(part.benchmarks) if benchmarks is None else benchmarks
    dtypes = [b.case.get("dtype") for b in benchmarks if b.flops and b.case.get("dtype")]
    result: dict[str, Any] = {
        "exercise": exercise.name, "part": part.name, "gpu": torch.cuda.get_device_name(),
        "roofline": probes.roofline(dtypes), "baseline": part.speed_baseline, "rows": [], "rounds_ms": {},
    }
    for bench in benchmarks:
        measured = []
        for i in range(rounds):
            log(f"  {exercise.name} {part.name} {bench.label}" + (f" (round {i + 1} of {rounds})" if rounds > 1 else "")
                + " ...")
            row = measure_replayed(part, module, bench, budget_s=budget_s, baselines=names, extra=extra)
            failed = row.failed_baseline
            while failed and failed != part.speed_baseline:  # an optional baseline broke: drop it, measure again
                log(f"  dropping the baseline {failed!r}: {row.error.splitlines()[0]}")
                names.remove(failed)
                row = measure_replayed(part, module, bench, budget_s=budget_s, baselines=names, extra=extra)
                failed = row.failed_baseline
            measured.append(row)
            if row.error:
                break
        if rounds > 1 and not any(r.error for r in measured):
            result["rounds_ms"][bench.label] = {
                YOURS if n == measure.STUDENT else n: [r.median(n) for r in measured] for n in measured[0].times}
        result["rows"].append(combine_rounds(measured))
    return result


def table_rows(result: dict[str, Any], part: Part, limits: calibrated.Thresholds | None,
               curve: speed_curves.Curve | None = None) -> list[dict[str, Any]]:
    """Flat rows for the table and the plot: one per (benchmark, implementation); the credit with the course's
    ``curve`` where it sets one."""
    roof = result["roofline"]
    base = result.get("baseline")
    verdict = credit.judge(part, measure.SpeedMeasurement(result["gpu"], list(result["rows"])), recheck=Verdict(True),
                           thresholds=limits, curve=curve, labels=[row.label for row in result["rows"]],
                           roofline=roof, require_calibration=False)
    scored_rows = {r.label: r for r in verdict.rows}
    flag = verdict.message if verdict.status == credit.FLAGGED else None
    out = []
    for row in result["rows"]:
        if row.error:
            out.append({"label": row.label, "impl": YOURS, "error": row.error})
            continue
        bench = next(b for b in part.benchmarks if b.label == row.label)
        work = workload.benchmark_work(part, bench)
        base_ms = row.median(base) if base else None
        yours_ms = row.median(measure.STUDENT)
        scored = scored_rows.get(row.label) if base else None
        for name, timed in row.times.items():
            # a copy does none of the math: its rate in TFLOP/s would mean nothing
            flops = None if name == "copy" else work.flops
            numbers = workload.roofline_numbers(work.bytes, flops, timed.median, work.dtype, roof)
            mine = name == measure.STUDENT
            out.append({
                "label": row.label, "impl": YOURS if mine else name, "ms": timed.median,
                "spread": timed.robust_cv, "mode": row.mode,
                "vs_baseline": base_ms / timed.median if base_ms else None,
                "yours_faster": None if mine or not yours_ms else timed.median / yours_ms, **numbers,
                "credit": scored if mine else None, "flag": flag if mine else None,
            })
    return out


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def render(result: dict[str, Any], rows: list[dict[str, Any]], console=None) -> None:
    """Print the table with rich."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
            console = Console(width=180)
    roof = result["roofline"]
    matmul = ", ".join(f"{d} {v:.0f} TFLOP/s" for d, v in roof.get("matmul_tflops", {}).items())
    title = f"{result['exercise']} · {result['part']} on {result['gpu']}"
    caption = f"roofline: copy {roof['copy_gbps']:.0f} GB/s" + (f"; matmul {matmul}" if matmul else "")
    if any(result.get("rounds_ms", {}).values()):
        caption += "; times: median of the rounds' medians, ± their spread"
    base = result.get("baseline") or "baseline"
    table = Table(title=title, caption=caption)
    for header, justify in (("benchmark", "left"), ("implementation", "left"), ("time", "right"),
                            ("± (IQR)", "right"), ("GB/s", "right"), ("TFLOP/s", "right"),
                            ("% roofline", "right"), (f"vs {base}", "right"), ("yours ×", "right"),
                            ("speed credit", "left")):
        table.add_column(header, justify=justify)
    last = None
    for r in rows:
        label = r["label"] if r["label"] != last else ""
        last = r["label"]
        if r.get("error"):
            table.add_row(label, r["impl"], "[red]error[/red]", "", "", "", "", "", "", r["error"].splitlines()[0])
            continue
        credit_text = ""
        c = r.get("credit")
        if r.get("flag"):
            credit_text = "[red]none: the measurement cannot be trusted[/red]"
        elif c is not None:
            note = "" if c.threshold == "calibrated" else " (uncalibrated)"
            credit_text = f"{c.credit:.0%} (full at {c.required_full:.2f}×){note}"
        style = "bold" if r["impl"] == YOURS else ""
        table.add_row(
            label, f"[{style}]{r['impl']}[/{style}]" if style else r["impl"], credit_messages.fmt_ms(r["ms"]),
            _fmt(100 * r["spread"], ".1f", "%"), _fmt(r.get("gbps"), ".0f"), _fmt(r.get("tflops"), ".2f"),
            _fmt(r.get("pct_roofline"), ".0f", "%"), _fmt(r.get("vs_baseline"), ".2f", "×"),
            _fmt(r.get("yours_faster"), ".2f", "×"), credit_text,
        )
    console.print(table)
    for flag in dict.fromkeys(r["flag"] for r in rows if r.get("flag")):
        console.print(flag)
    for label, by_impl in result.get("rounds_ms", {}).items():
        for impl, values in by_impl.items():
            console.print(f"  {label} {impl} rounds: " + " ".join(credit_messages.fmt_ms(v) for v in values))


def plot_svg(result: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The part's roofline chart: one colour per implementation, your benchmarks labelled."""
    points = [{"label": r["label"] if r["impl"] == YOURS else "", "series": r["impl"], "gbps": r.get("gbps"),
               "tflops": r.get("tflops"), "pct_roofline": r.get("pct_roofline")} for r in rows if not r.get("error")]
    for p, r in zip(points, (r for r in rows if not r.get("error"))):
        if not (p["gbps"] and p["tflops"]):  # a bar: say whose it is
            p["label"] = f"{r['label']} · {r['impl']}"
    gbps, tflops = roofline.peaks(result["roofline"])
    return roofline.roofline_svg(points, title=f"{result['exercise']} {result['part']} ({result['gpu']})",
                                 peak_gbps=gbps, peak_tflops=tflops)


def write_plot(results: list[tuple[dict[str, Any], list[dict[str, Any]]]], path: str | Path,
               description: str = "") -> Path:
    """The charts of ``results``: one SVG image (.svg) or a self-contained HTML page (.html)."""
    path = Path(path)
    svgs = [plot_svg(result, rows) for result, rows in results]
    if path.suffix == ".html":
        title = "grader bench " + ", ".join(sorted({r["exercise"] for r, _ in results}))
        path.write_text(roofline.html_page(title, svgs, [description] if description else []))
    else:
        path.write_text(roofline.stack(svgs))
    return path


class _Refused(ValueError):
    """A command line ``grader bench`` cannot run: the message says why."""


def _what_to_time(args: argparse.Namespace):
    """The exercise, its parts, the benchmarks chosen per part, the baselines and the rounds the command line asks
    for (a leaderboard case names its own); :class:`_Refused` where they are not there."""
    rounds = args.rounds
    try:
        exercise = exercises.get(args.exercise)
        baselines = [b.strip() for b in args.baselines.split(",") if b.strip()] if args.baselines else None
        labels, part_name = args.benchmark, args.part
        if args.leaderboard:
            board = LEADERBOARDS.get(exercise.name)
            if board is None:
                raise KeyError(f"{exercise.name} has no leaderboard case (these do: {', '.join(LEADERBOARDS)})")
            part_name, labels = board.part, [board.benchmark]
            baselines = baselines or list(board.baselines)
            rounds = rounds or board.rounds
        parts = _parts(exercise, part_name)
        chosen = {p.name: _benchmarks(p, labels) for p in parts if p.benchmarks}
    except KeyError as exc:
        raise _Refused(exc.args[0]) from None
    if not chosen:
        raise _Refused(f"{exercise.name} declares no benchmarks")
    if args.plot and Path(args.plot).suffix not in PLOT_SUFFIXES:
        raise _Refused(f"--plot {args.plot}: the file must end in .svg or .html")
    if (rounds or 1) < 1:
        raise _Refused("--rounds must be at least 1")
    return exercise, parts, chosen, baselines, rounds


def run(args: argparse.Namespace) -> int:
    mode = runtime.configure()
    try:
        exercise, parts, chosen, baselines, rounds = _what_to_time(args)
    except _Refused as exc:
        print(f"grader bench: {exc}", file=sys.stderr)
        return 2
    if not mode.is_cuda:
        print("grader bench: needs a CUDA GPU — here kernels run in the Triton interpreter, whose speed says "
              "nothing about a GPU", file=sys.stderr)
        return 2
    try:
        module = loader.load(Path(args.impl), exercise, tuple(f for p in parts for f in p.functions))
    except loader.LoadError as exc:
        print(f"grader bench: {exc}", file=sys.stderr)
        return 2
    try:
        limits = credit.load_thresholds()
    except calibrated.ThresholdsError as exc:
        print(f"grader bench: {exc} (credit not shown)", file=sys.stderr)
        limits = None
    course = args.course or os.environ.get("GRADER_COURSE")
    try:
        curves = speed_curves.course_curves(course) if course else {}
    except calibrated.ThresholdsError as exc:
        print(f"grader bench: --course: {exc}", file=sys.stderr)
        return 2
    print(f"grader bench {exercise.name} --impl {args.impl}: {mode.description}")
    if args.leaderboard:
        print(LEADERBOARDS[exercise.name].description)
    results = []
    for part in (p for p in parts if p.name in chosen):
        result = measure_part_table(exercise, part, module, baselines=baselines, budget_s=args.budget_s,
                                    benchmarks=chosen[part.name], rounds=rounds or 1, in_process=args.in_process)
        if any(r.not_implemented for r in result["rows"]):
            print(f"grader bench: {' / '.join(part.functions)} is not implemented yet — see {exercise.handout}",
                  file=sys.stderr)
            return 1
        curve = speed_curves.curve_for(curves, exercise.name, part.name)
        rows = table_rows(result, part, limits, curve)
        render(result, rows)
        if curve is not None:
            print(f"speed curve (the course file's): {curve.describe(part.speed_baseline or 'the baseline')}")
        results.append((result, rows))
    if limits is None:
        print("speed credit: this GPU is not calibrated — shown against the calibrated GPUs' ratios "
              "(`grader calibrate` makes its thresholds file)")
    if args.plot:
        print(f"wrote {write_plot(results, args.plot, mode.description)}")
    if args.json:
        data = {"device": mode.description, "impl": args.impl,
                "parts": [{**r, "rows": [row.to_dict() for row in r["rows"]]} for r, _ in results]}
        Path(args.json).write_text(json.dumps(data, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0
