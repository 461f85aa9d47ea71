"""``grader calibrate``: measure the reference solutions against their baselines on this GPU and write
its thresholds file (``grader/speed/thresholds/<gpu>.toml``; see grader/speed/thresholds/README.md).

For every speed-graded part and benchmark, the reference and the speed baseline are timed side by
side ``--repeats`` times; the file records the median times and ratio (baseline / reference), the
ratio's spread over the repeats, and the requirements derived from the ratio:

    full    = (full_margin - 2 × ratio CV) × reference ratio   (default 0.92: a kernel about 15%
              slower than the reference, at 1/1.15 = 0.87 of its ratio, loses credit; a benchmark
              whose ratio varied between the repeats gets twice that spread more room, at most down
              to halfway to the partial margin)
    partial = partial_margin × reference ratio   (default 0.5: credit starts above half its speed)

Calibrating some exercises keeps the other entries of an existing file for the same GPU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader import exercises
from grader.checks import loader, runtime, verdicts
from grader.checks.spec import Exercise, Part
from grader.speed import in_process, measure, probes, stats
from grader.speed.thresholds import calibrated, gpu_files, speed_curves

# The same fractions of the reference's speed as grading beside the yardstick uses.
FULL_MARGIN = speed_curves.FULL_FRACTION
PARTIAL_MARGIN = speed_curves.PARTIAL_FRACTION


@dataclass(frozen=True)
class Run:
    """One repeat of one benchmark: the reference's and the baseline's median times."""

    reference_ms: float
    baseline_ms: float

    @property
    def ratio(self) -> float:
        return self.baseline_ms / self.reference_ms


def full_factor(full_margin: float, partial_margin: float, ratio_cv: float) -> float:
    """The fraction of the reference's ratio that gets full credit: ``full_margin`` less twice the
    ratio's spread over the calibration repeats: a noisy benchmark gets more room, so noise never costs
    the reference its credit; the floor keeps full credit above the midpoint between the margins however
    noisy the calibration was."""
    return max(full_margin - 2 * ratio_cv, (full_margin + partial_margin) / 2)


def threshold_from_runs(baseline: str, runs: Sequence[Run], *, full_margin: float = FULL_MARGIN,
                        partial_margin: float = PARTIAL_MARGIN) -> calibrated.Threshold:
    """The thresholds entry for one benchmark from its repeats."""
    if not runs:
        raise ValueError("no runs to calibrate from")
    if not 0 < partial_margin < full_margin <= 1:
        raise ValueError(f"need 0 < partial margin < full margin <= 1, got {partial_margin}, {full_margin}")
    ratios = [r.ratio for r in runs]
    ratio = statistics.median(ratios)
    spread = stats.cv(ratios)
    return calibrated.Threshold(
        baseline=baseline,
        reference_ms=statistics.median(r.reference_ms for r in runs),
        baseline_ms=statistics.median(r.baseline_ms for r in runs),
        reference_ratio=ratio,
        ratio_cv=spread,
        full=full_factor(full_margin, partial_margin, spread) * ratio,
        partial=partial_margin * ratio,
    )


# How the thresholds' times were taken: the recorded kernels replayed without the solution's Python, as the
# grader's trusted timer times a student (grader.speed.trusted).
TIMING = "replay"


def speed_parts(names: Iterable[str] = (), *, include_ungraded: bool = False) -> list[tuple[Exercise, Part]]:
    """Parts with benchmarks and a speed baseline: the speed-graded ones (``speed_points > 0``), or
    all of them with ``include_ungraded``."""
    chosen = [exercises.get(n) for n in names] or list(exercises.all_exercises())
    return [(e, p) for e in chosen for p in e.parts
            if p.benchmarks and p.speed_baseline and (include_ungraded or p.speed_points > 0)]


def calibrate(
    names: Iterable[str] = (),
    *,
    impl_root: Path = Path("solutions"),
    repeats: int = 3,
    budget_s: float = 1.5,
    full_margin: float = FULL_MARGIN,
    partial_margin: float = PARTIAL_MARGIN,
    recheck: bool = True,
    log: Callable[[str], None] = print,
    parts: list[tuple[Exercise, Part]] | None = None,
) -> tuple[calibrated.Thresholds, list[dict[str, Any]]]:
    """Measure and return this GPU's thresholds and the raw rows (CUDA only). ``parts`` overrides
    the choice by ``names`` (default: the speed-graded parts)."""
    import torch
    import triton

    parts = speed_parts(names) if parts is None else parts
    if not parts:
        raise SystemExit("grader calibrate: no speed-graded parts (benchmarks and speed_points > 0) to calibrate")
    dtypes = sorted({b.case.get("dtype") for _, p in parts for b in p.benchmarks if b.flops and b.case.get("dtype")})
    roof = probes.roofline(dtypes)
    log(f"roofline: copy {roof['copy_gbps']:.0f} GB/s; matmul "
        + ", ".join(f"{d} {v:.0f} TFLOP/s" for d, v in roof["matmul_tflops"].items()))
    entries: dict[calibrated.Key, calibrated.Threshold] = {}
    rows: list[dict[str, Any]] = []
    for exercise, part in parts:
        module = loader.load(impl_root, exercise, part.functions)
        for bench in part.benchmarks:
            runs = []
            for _ in range(repeats):
                row = in_process.measure_replayed(part, module, bench, budget_s=budget_s,
                                                  baselines=[part.speed_baseline])
                if row.error:
                    raise SystemExit(f"grader calibrate: {exercise.name} {part.name} {bench.label}: {row.error}")
                runs.append(Run(row.median(measure.STUDENT), row.median(part.speed_baseline)))
                rows.append({"exercise": exercise.name, "part": part.name, **row.to_dict()})
            entry = threshold_from_runs(part.speed_baseline, runs, full_margin=full_margin,
                                        partial_margin=partial_margin)
            entries[(exercise.name, part.name, bench.label)] = entry
            log(f"{exercise.name} {part.name} {bench.label}: reference {entry.reference_ms:.4f} ms, "
                f"{part.speed_baseline} {entry.baseline_ms:.4f} ms, ratio {entry.reference_ratio:.3f} "
                f"(cv {entry.ratio_cv:.1%}) -> full {entry.full:.3f}, partial {entry.partial:.3f}")
        if recheck:
            verdict = verdicts.run_case(part, module, measure.recheck_case(part, 0), "cuda")
            if not verdict.passed:
                raise SystemExit(f"grader calibrate: the reference {exercise.name} is wrong at benchmark size: "
                                 f"{verdict.message}")
    meta = {
        "calibrated_at": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "calibration": {"full_margin": full_margin, "partial_margin": partial_margin, "repeats": repeats,
                        "budget_s": budget_s, "timing": TIMING},
    }
    result = calibrated.Thresholds(torch.cuda.get_device_name(), entries, None, roof["copy_gbps"],
                                   roof["matmul_tflops"], meta)
    return result, rows


def merge(new: calibrated.Thresholds, old: calibrated.Thresholds | None) -> calibrated.Thresholds:
    """``new`` plus the entries of ``old`` (same GPU) that were not recalibrated."""
    if old is None or old.gpu != new.gpu:
        return new
    entries = dict(old.entries)
    entries.update(new.entries)
    matmul = dict(old.matmul_tflops)
    matmul.update(new.matmul_tflops)
    return calibrated.Thresholds(new.gpu, entries, new.path, new.copy_gbps, matmul, new.meta)


def output_path(out: str | None, gpu: str) -> Path:
    if not out:
        return gpu_files.path_for(gpu)
    path = Path(out)
    return path / f"{calibrated.slug(gpu)}.toml" if path.is_dir() or not path.suffix else path


HEADER = (
    "Speed thresholds for one GPU model, written by `grader calibrate` (see grader/speed/thresholds/README.md).",
    "ratio = baseline_ms / student_ms; credit 1 at ratio >= full, 0 at ratio <= partial, linear between.",
)


def write(result: calibrated.Thresholds, path: Path, log: Callable[[str], None] = print) -> Path:
    old = None
    if path.is_file():
        try:
            old = gpu_files.load(path)
        except calibrated.ThresholdsError as exc:
            log(f"replacing an invalid file: {exc}")
        if old is not None and old.gpu != result.gpu:
            log(f"replacing {path}: it was calibrated on {old.gpu}, this GPU is {result.gpu}")
    merged = merge(result, old)
    return gpu_files.write(merged, path, header=HEADER)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("exercises", nargs="*", metavar="EXERCISE",
                        help="exercises to calibrate (default: every speed-graded one)")
    parser.add_argument("--impl", default="solutions", metavar="PATH",
                        help="the reference implementations (default: solutions)")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="file or directory to write (default: grader/speed/thresholds/<gpu>.toml)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per benchmark (default: 3)")
    parser.add_argument("--budget-s", type=float, default=1.5,
                        help="seconds of timing per benchmark and repeat (default: 1.5)")
    parser.add_argument("--full-margin", type=float, default=FULL_MARGIN,
                        help=f"full credit at this fraction of the reference's ratio (default: {FULL_MARGIN})")
    parser.add_argument("--partial-margin", type=float, default=PARTIAL_MARGIN,
                        help=f"zero credit at this fraction of the reference's ratio (default: {PARTIAL_MARGIN})")
    parser.add_argument("--no-recheck", action="store_true",
                        help="skip checking the references' results at benchmark size")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the raw measurements as JSON")


def run(args: argparse.Namespace) -> int:
    if not runtime.configure().is_cuda:
        print("grader calibrate: needs a CUDA GPU (kernels would run in the Triton interpreter, whose speed says "
              "nothing about a GPU)", file=sys.stderr)
        return 2
    impl = Path(args.impl)
    if not impl.is_dir():
        print(f"grader calibrate: --impl {args.impl}: no such directory", file=sys.stderr)
        return 2
    try:
        result, rows = calibrate(args.exercises, impl_root=impl, repeats=args.repeats, budget_s=args.budget_s,
                                 full_margin=args.full_margin, partial_margin=args.partial_margin,
                                 recheck=not args.no_recheck)
    except (KeyError, ValueError, loader.LoadError) as exc:
        print(f"grader calibrate: {exc}", file=sys.stderr)
        return 2
    path = write(result, output_path(args.out, result.gpu))
    print(f"wrote {path} ({len(result.entries)} benchmarks, {result.gpu})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0
