"""``grader bench EXERCISE [--impl PATH] [--plot FILE]``: your kernel against the baselines, on the GPU.

For every benchmark size of every part (or ``--part``), the student's kernel and all the part's
baselines are timed side by side (:mod:`grader.speed.timing`: fresh inputs, L2 flushed, medians), and a
table shows time, spread, achieved GB/s and TFLOP/s, the percentage of the roofline (the time the
measured copy bandwidth and matmul rate allow, over the time taken) and the speed relative to the
part's speed baseline, with the speed credit when the GPU is calibrated. ``--plot FILE`` draws the
same numbers like Triton's ``perf_report`` (needs matplotlib: ``pip install '.[plot]'``).

This is the course's lesson "kernel benchmarking and profiling", made runnable: a kernel far below
the roofline is leaving bandwidth or tensor-core time on the table, and the table says which.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grader import exercises
from grader.checks import loader, runtime
from grader.checks.spec import Exercise, Part
from grader.speed import credit, measure, thresholds, timing

YOURS = "yours"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("exercise", help="exercise name (see `grader list`)")
    parser.add_argument("--impl", default="assignments", metavar="PATH",
                        help="implementation tree laid out like assignments/ (default: assignments; "
                             "'solutions' benchmarks the reference)")
    parser.add_argument("--part", default=None, help="only this part (default: every part with benchmarks)")
    parser.add_argument("--baselines", default=None, metavar="A,B",
                        help="comma-separated baselines to time (default: all the part declares)")
    parser.add_argument("--budget-s", type=float, default=1.0, help="seconds of timing per benchmark (default: 1)")
    parser.add_argument("--plot", default=None, metavar="FILE", help="also draw the results to a PNG file")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")


def _parts(exercise: Exercise, name: str | None) -> list[Part]:
    if name:
        return [exercise.part(name)]
    return [p for p in exercise.parts if p.benchmarks]


def measure_part_table(exercise: Exercise, part: Part, module, *, baselines: list[str] | None, budget_s: float,
                       log=print) -> dict[str, Any]:
    """All benchmarks of one part: {"exercise", "part", "gpu", "roofline", "baseline", "rows"}."""
    import torch

    names = list(part.baselines) if baselines is None else [b for b in baselines if b in part.baselines]
    if part.speed_baseline and part.speed_baseline not in names:
        names.insert(0, part.speed_baseline)
    dtypes = [b.case.get("dtype") for b in part.benchmarks if b.flops and b.case.get("dtype")]
    result: dict[str, Any] = {
        "exercise": exercise.name, "part": part.name, "gpu": torch.cuda.get_device_name(),
        "roofline": timing.roofline(dtypes), "baseline": part.speed_baseline, "rows": [],
    }
    for bench in part.benchmarks:
        log(f"  {exercise.name} {part.name} {bench.label} ...")
        row = measure.measure_benchmark(part, module, bench, device="cuda", budget_s=budget_s, baselines=names)
        failed = row.failed_baseline
        while failed and failed != part.speed_baseline:  # an optional baseline broke: drop it, measure again
            log(f"  dropping the baseline {failed!r}: {row.error.splitlines()[0]}")
            names.remove(failed)
            row = measure.measure_benchmark(part, module, bench, device="cuda", budget_s=budget_s, baselines=names)
            failed = row.failed_baseline
        result["rows"].append(row)
    return result


def table_rows(result: dict[str, Any], part: Part, limits: thresholds.Thresholds | None) -> list[dict[str, Any]]:
    """Flat rows for the table and the plot: one per (benchmark, implementation)."""
    roof = result["roofline"]
    base = result.get("baseline")
    out = []
    for row in result["rows"]:
        if row.error:
            out.append({"label": row.label, "impl": YOURS, "error": row.error})
            continue
        bench = next(b for b in part.benchmarks if b.label == row.label)
        work = credit.benchmark_work(part, bench)
        base_ms = row.median(base) if base else None
        scored = None
        if base:
            threshold, source = credit.resolve_threshold(part, row.label, limits)
            scored = credit.benchmark_credit(row, row.label, work, threshold, source, roof)
        for name, stats in row.times.items():
            # a copy does none of the math: its rate in TFLOP/s would mean nothing
            flops = None if name == "copy" else work.flops
            numbers = credit.roofline_numbers(work.bytes, flops, stats.median, work.dtype, roof)
            out.append({
                "label": row.label, "impl": YOURS if name == measure.STUDENT else name, "ms": stats.median,
                "spread": stats.robust_cv, "mode": row.mode,
                "vs_baseline": base_ms / stats.median if base_ms else None, **numbers,
                "credit": scored if name == measure.STUDENT else None,
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
            console = Console(width=160)
    roof = result["roofline"]
    matmul = ", ".join(f"{d} {v:.0f} TFLOP/s" for d, v in roof.get("matmul_tflops", {}).items())
    title = f"{result['exercise']} · {result['part']} on {result['gpu']}"
    caption = f"roofline: copy {roof['copy_gbps']:.0f} GB/s" + (f"; matmul {matmul}" if matmul else "")
    base = result.get("baseline") or "baseline"
    table = Table(title=title, caption=caption)
    for header, justify in (("benchmark", "left"), ("implementation", "left"), ("time", "right"),
                            ("± (IQR)", "right"), ("GB/s", "right"), ("TFLOP/s", "right"),
                            ("% roofline", "right"), (f"vs {base}", "right"), ("speed credit", "left")):
        table.add_column(header, justify=justify)
    last = None
    for r in rows:
        label = r["label"] if r["label"] != last else ""
        last = r["label"]
        if r.get("error"):
            table.add_row(label, r["impl"], "[red]error[/red]", "", "", "", "", "", r["error"].splitlines()[0])
            continue
        credit_text = ""
        c = r.get("credit")
        if c is not None:
            note = "" if c["threshold"] == "calibrated" else " (uncalibrated)"
            credit_text = f"{c['credit']:.0%} (full at {c['required_full']:.2f}×){note}"
        style = "bold" if r["impl"] == YOURS else ""
        table.add_row(
            label, f"[{style}]{r['impl']}[/{style}]" if style else r["impl"], credit.fmt_ms(r["ms"]),
            _fmt(100 * r["spread"], ".1f", "%"), _fmt(r.get("gbps"), ".0f"), _fmt(r.get("tflops"), ".2f"),
            _fmt(r.get("pct_roofline"), ".0f", "%"), _fmt(r.get("vs_baseline"), ".2f", "×"), credit_text,
        )
    console.print(table)


def plot(results: list[tuple[dict[str, Any], list[dict[str, Any]]]], path: str | Path) -> Path:
    """A perf_report-style PNG: per part, achieved GB/s (TFLOP/s for compute-bound parts) of every
    implementation across the benchmark sizes, with the roof dashed."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("grader bench --plot needs matplotlib: pip install 'triton-kernels-course[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.5), squeeze=False)
    for ax, (result, rows) in zip(axes[0], results):
        ok = [r for r in rows if not r.get("error")]
        compute = sum(r.get("bound") == "compute" for r in ok) > len(ok) / 2
        key, unit = ("tflops", "TFLOP/s") if compute else ("gbps", "GB/s")
        labels = list(dict.fromkeys(r["label"] for r in rows))
        top = 0.0
        for impl in dict.fromkeys(r["impl"] for r in ok):
            ys = [next((r.get(key) for r in ok if r["impl"] == impl and r["label"] == lab), None) for lab in labels]
            xs = [i for i, y in enumerate(ys) if y is not None]
            ax.plot(xs, [ys[i] for i in xs], marker="o", linewidth=2.5 if impl == YOURS else 1.2, label=impl)
            top = max([top] + [ys[i] for i in xs])
        roof = result["roofline"]
        peaks = roof.get("matmul_tflops") or {}
        ceiling = max(peaks.values()) if compute and peaks else None if compute else roof.get("copy_gbps")
        if ceiling:
            ax.axhline(ceiling, linestyle="--", color="gray", label="matmul rate" if compute else "copy bandwidth")
            top = max(top, ceiling)
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
        ax.set_ylabel(unit)
        ax.set_ylim(0, 1.1 * top if top > 0 else None)
        ax.set_title(f"{result['exercise']} {result['part']} ({result['gpu']})", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> int:
    mode = runtime.configure()
    try:
        exercise = exercises.get(args.exercise)
        parts = _parts(exercise, args.part)
    except KeyError as exc:
        print(f"grader bench: {exc.args[0]}", file=sys.stderr)
        return 2
    if not parts:
        print(f"grader bench: {exercise.name} declares no benchmarks", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("grader bench --plot needs matplotlib: pip install 'triton-kernels-course[plot]'", file=sys.stderr)
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
    baselines = [b.strip() for b in args.baselines.split(",") if b.strip()] if args.baselines else None
    try:
        limits = credit.load_thresholds()
    except thresholds.ThresholdsError as exc:
        print(f"grader bench: {exc} (credit not shown)", file=sys.stderr)
        limits = None
    results = []
    for part in parts:
        result = measure_part_table(exercise, part, module, baselines=baselines, budget_s=args.budget_s)
        if any(r.not_implemented for r in result["rows"]):
            print(f"grader bench: {' / '.join(part.functions)} is not implemented yet — see {exercise.handout}",
                  file=sys.stderr)
            return 1
        rows = table_rows(result, part, limits)
        render(result, rows)
        results.append((result, rows))
    if limits is None:
        print("speed credit: this GPU is not calibrated — shown against the calibrated GPUs' ratios "
              "(`grader calibrate` makes its thresholds file)")
    if args.plot:
        print(f"wrote {plot(results, args.plot)}")
    if args.json:
        Path(args.json).write_text(json.dumps([{**r, "rows": [row.to_dict() for row in r["rows"]]} for r, _ in results],
                                              indent=1, default=str))
        print(f"wrote {args.json}")
    return 0
