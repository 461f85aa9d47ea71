"""GPU check of speed grading (issue 5): calibrate, then grade the references and the slowed fixtures.

    PYTHONUNBUFFERED=1 PYTHONPATH=$PWD python3 scripts/gpu/speed_check.py [--runs 10] [--budget-s 0.5]

From the repository root, on an H100 or H200. Steps (each prints its wall time; the whole script
stops starting new steps after --limit-s, default 450 s):

1. roofline (copy bandwidth, matmul rates) and ``grader calibrate`` (3 repeats) for every
   speed-graded part and every part a slowed fixture declares: merges into
   ``grader/thresholds/<gpu>.toml`` (other entries kept) and copies the result to ``$OUT/<gpu>.toml``;
2. the done-criteria: the references' speed measurement --runs times in a row (must get full credit
   every time), then every slowed fixture in tests/slow_fixtures --runs times (must lose credit every
   time); a table of credit counts and the CV of the measured ratios per benchmark, in Markdown for
   docs/performance.md;
3. one full ``measure_part`` + ``score_part`` per reference of gelu/softmax (secret-seeded recheck
   judged against the float64 reference);
4. engine self-checks: CUDA-graph replay vs events on a short kernel, cached/stale results caught on
   the GPU, the pytest-benchmark CUDA-event timer against ``triton.testing.do_bench``;
5. ``grader bench gelu --impl solutions --plot $OUT/bench_gelu.png``;
6. the pytest speed tests once (``-m speed``), with ``--benchmark-json $OUT/pytest_speed.json``.

Writes ``$OUT/speed_check.json`` with every number. To stay inside one 10-minute command, split:

    python3 scripts/gpu/speed_check.py --exercises gelu softmax
    python3 scripts/gpu/speed_check.py --exercises flash_attention --criteria-only

(copy the first run's ``$OUT/<gpu>.toml`` into grader/thresholds/ before the second: they merge).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from grader import runtime  # noqa: E402

MODE = runtime.configure()

import torch  # noqa: E402
import triton  # noqa: E402

from grader import calibrate, exercises, loader, speed, timing  # noqa: E402
from grader import thresholds as th  # noqa: E402
from grader.spec import Benchmark, Case  # noqa: E402

OUT = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
START = time.time()
REPORT: dict = {"steps": {}}


def elapsed() -> float:
    return time.time() - START


def step(name: str, limit_s: float):
    """Decorator-ish runner: skip when over the time limit, time it, keep going on errors."""
    def run(fn):
        if elapsed() > limit_s:
            print(f"\n== {name}: SKIPPED (over the {limit_s:.0f} s limit at {elapsed():.0f} s)")
            REPORT["steps"][name] = {"skipped": True}
            return None
        print(f"\n== {name} (t = {elapsed():.0f} s)")
        t0 = time.time()
        try:
            result = fn()
            ok = True
        except Exception:
            traceback.print_exc()
            result, ok = None, False
        REPORT["steps"][name] = {"ok": ok, "seconds": round(time.time() - t0, 1)}
        print(f"-- {name}: {'ok' if ok else 'ERROR'} in {time.time() - t0:.1f} s")
        return result

    return run


def save() -> None:
    if OUT:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "speed_check.json").write_text(json.dumps(REPORT, indent=1, default=str))


def grade_once(exercise, part, module, limits, budget_s: float, min_rounds: int) -> tuple[float, list[dict]]:
    """One speed grading of a part, without the (CPU-heavy) recheck: the part's fraction and rows."""
    rows = []
    for bench in part.benchmarks:
        rule = timing.StopRule(min_rounds=min_rounds, budget_s=budget_s)
        row = speed.measure_benchmark(part, module, bench, device="cuda", budget_s=budget_s, rule=rule)
        score = speed.score_benchmark(part, row, exercise=exercise.name, gpu=torch.cuda.get_device_name(),
                                      roofline=timing.roofline(speed._flop_dtypes(part)), thresholds=limits)
        rows.append(score.rows[0] | {"stop": row.get("stop"), "rounds_measured": row.get("rounds")})
    return statistics.fmean(r["credit"] for r in rows), rows


def slow_fixtures() -> list[tuple[str, str, Path, set[str]]]:
    """(name, exercise, root, parts it is slower on: the docstring's 'slower: <part>' lines)."""
    found = []
    for module in sorted((ROOT / "tests" / "slow_fixtures").glob("*/*/*.py")):
        doc = ast.get_docstring(ast.parse(module.read_text())) or ""
        slower = {line.split(":", 1)[1].strip() for line in doc.splitlines() if line.startswith("slower:")}
        found.append((module.parts[-3], module.parts[-2], module.parent.parent, slower))
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=0.5, help="timing budget per benchmark and run")
    parser.add_argument("--calibrate-budget-s", type=float, default=1.0)
    parser.add_argument("--exercises", nargs="*", default=None, help="default: every speed-graded exercise")
    parser.add_argument("--limit-s", type=float, default=450.0, help="start no new step after this")
    parser.add_argument("--no-install", action="store_true", help="do not write grader/thresholds/<gpu>.toml")
    parser.add_argument("--fixture-min-rounds", type=int, default=5,
                        help="minimum timed rounds for the slowed fixtures (far slower: no precise median needed)")
    parser.add_argument("--criteria-only", action="store_true",
                        help="only calibrate and the N-runs criteria (skip measure_part, engine checks, bench, pytest)")
    args = parser.parse_args()
    if not MODE.is_cuda:
        print("speed_check.py needs a CUDA GPU")
        return 2
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}; torch {torch.__version__}, triton {triton.__version__}; OUT={OUT}")
    REPORT.update(gpu=gpu, torch=torch.__version__, triton=triton.__version__, runs=args.runs,
                  budget_s=args.budget_s)
    fixtures = slow_fixtures()
    slowed = {(exercise, part) for _, exercise, _, declared in fixtures for part in declared}
    # the speed-graded parts, and the parts a slowed fixture is declared for (graded or not yet)
    parts = [(e, p) for e, p in calibrate.speed_parts(args.exercises or (), include_ungraded=True)
             if p.speed_points > 0 or (e.name, p.name) in slowed]
    print("measured:", ", ".join(f"{e.name}.{p.name}{'' if p.speed_points > 0 else ' (not graded yet)'}"
                                 for e, p in parts))

    # 1. roofline + calibration -------------------------------------------------------------------
    def do_calibrate():
        result, _ = calibrate.calibrate(impl_root=ROOT / "solutions", repeats=3, parts=parts,
                                        budget_s=args.calibrate_budget_s, recheck=False)
        REPORT["roofline"] = {"copy_gbps": result.copy_gbps, "matmul_tflops": dict(result.matmul_tflops)}
        # Merge into the repository's file (entries of exercises not measured now are kept), then copy
        # the merged file to $OUT: only $OUT comes back from the GPU machine.
        target = th.path_for(gpu) if not args.no_install else (OUT or Path("/tmp")) / f"{th.slug(gpu)}.toml"
        written = [calibrate.write(result, target)]
        if OUT and target.parent != OUT:
            OUT.mkdir(parents=True, exist_ok=True)
            written.append(OUT / target.name)
            written[-1].write_text(target.read_text())
        print("wrote", ", ".join(map(str, written)))
        return th.load(target)

    limits = step("calibrate", args.limit_s)(do_calibrate)
    save()
    if limits is None:
        return 1
    REPORT["thresholds"] = {" ".join(k): vars(v) for k, v in limits.entries.items()}

    # 2. done-criteria: references full credit N/N, slowed fixtures lose credit N/N ----------------
    variants = [(e, p, "reference", ROOT / "solutions") for e, p in parts]
    for name, exercise_name, root, slower in fixtures:
        variants += [(e, p, name, root) for e, p in parts if e.name == exercise_name and p.name in slower]
    summary = []
    for exercise, part, variant, root in variants:
        def runs(exercise=exercise, part=part, variant=variant, root=root):
            module = loader.load(root, exercise, part.functions)
            fractions, per_bench = [], {}
            for i in range(args.runs):
                min_rounds = timing.StopRule().min_rounds if variant == "reference" else args.fixture_min_rounds
                fraction, rows = grade_once(exercise, part, module, limits, args.budget_s, min_rounds)
                fractions.append(fraction)
                for r in rows:
                    per_bench.setdefault(r["label"], []).append(r)
                print(f"  run {i + 1}: credit {fraction:.0%}  " + "  ".join(
                    f"{r['label']} {r['ratio'] or 0:.3f}x{'' if not r['error'] else ' ERROR ' + r['error'][:80]}"
                    for r in rows))
            expect_full = variant == "reference"
            passed = all(f >= 1.0 for f in fractions) if expect_full else all(f < 1.0 for f in fractions)
            for label, rs in per_bench.items():
                ratios = [r["ratio"] for r in rs if r["ratio"]]
                summary.append({
                    "exercise": exercise.name, "part": part.name, "variant": variant, "benchmark": label,
                    "full_credit": sum(r["credit"] >= 1.0 for r in rs), "runs": len(rs),
                    "mean_credit": statistics.fmean(r["credit"] for r in rs),
                    "ratio_mean": statistics.fmean(ratios) if ratios else None,
                    "ratio_cv": timing.cv(ratios), "required_full": rs[0]["required_full"],
                    "student_ms": statistics.median(r["student_ms"] for r in rs if r["student_ms"]) if ratios else None,
                    "pct_roofline": statistics.median(r["pct_roofline"] or 0 for r in rs),
                })
            verdict = "PASS" if passed else "FAIL"
            want = "full credit every run" if expect_full else "less than full credit every run"
            print(f"  {exercise.name}.{part.name} {variant}: {verdict} ({want}); part credit per run: "
                  + ", ".join(f"{f:.0%}" for f in fractions))
            REPORT.setdefault("criteria", []).append({"exercise": exercise.name, "part": part.name,
                                                      "variant": variant, "fractions": fractions, "pass": passed})

        step(f"{args.runs} runs: {exercise.name}.{part.name} {variant}", args.limit_s)(runs)
        save()
    REPORT["summary"] = summary
    print("\n| exercise | part | variant | benchmark | full credit | mean credit | ratio (mean) | ratio CV | "
          "required | time (ms) | % roofline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['exercise']} | {s['part']} | {s['variant']} | {s['benchmark']} | {s['full_credit']}/{s['runs']} | "
              f"{s['mean_credit']:.0%} | {s['ratio_mean'] or 0:.3f} | {100 * s['ratio_cv']:.2f}% | "
              f"{s['required_full']:.3f} | {s['student_ms'] or 0:.4f} | {s['pct_roofline']:.0f}% |")
    save()

    if args.criteria_only:
        return finish()

    # 3. the full grader path for gelu/softmax references (recheck judged on the CPU) --------------
    for exercise, part in [(e, p) for e, p in parts if e.name in ("gelu", "softmax")]:
        def full(exercise=exercise, part=part):
            module = loader.load(ROOT / "solutions", exercise, part.functions)
            m = speed.measure_part(part, module, device="cuda", secret_seed=12345, budget_s=2.0)
            score = speed.score_part(part, m, thresholds=limits)
            print(score.message)
            REPORT.setdefault("measure_part", {})[exercise.name] = {"fraction": score.fraction,
                                                                    "calibrated": score.calibrated}
            assert score.fraction == 1.0, "the reference must get full speed credit"

        step(f"measure_part+score_part {exercise.name}", args.limit_s)(full)
    save()

    # 4. engine self-checks ---------------------------------------------------------------------
    def engine():
        gelu_ex = exercises.get("gelu")
        part = gelu_ex.parts[0]
        ref = loader.load(ROOT / "solutions", gelu_ex, part.functions)
        small = Benchmark("fp32-256x1024", Case({"shape": (256, 1024), "dtype": "float32", "layout": "contiguous",
                                                 "values": "normal"}), bytes_moved=part.benchmarks[0].bytes_moved)
        out = {}
        for mode, below in (("graph", 0.05), ("events", None)):
            row = speed.measure_benchmark(part, ref, small, device="cuda", budget_s=0.5, graph_below_ms=below)
            out[mode] = {"mode": row.get("mode"), "student_ms": row["times"]["student"]["median"],
                         "torch_ms": row["times"]["torch"]["median"], "error": row.get("error")}
        print("  short kernel (1 MB):", json.dumps(out))
        cache = {}

        def cached(x):
            return cache.setdefault(tuple(x.shape), ref.gelu(x))

        previous = []

        def stale(x):
            previous.append(ref.gelu(x))
            return previous[-1] if len(previous) <= 2 else previous[-2]

        for name, fn in (("cached", cached), ("stale", stale)):
            cheat = types.SimpleNamespace(gelu=fn)
            row = speed.measure_benchmark(part, cheat, part.benchmarks[0], device="cuda", budget_s=0.3)
            out[name] = row.get("error")
            print(f"  {name} cheat -> {row.get('error')}")
            assert row.get("error"), f"the {name} cheat was timed"
        # the pytest-benchmark timer against do_bench on the first benchmark
        bench = part.benchmarks[0]
        src = speed.input_sets(part, bench, 1)[0]["x"].cuda()
        timer, clock = timing.CudaEventTimer(), timing.CudaClock()
        samples = []
        for _ in range(50):
            x = src.clone()
            clock.flush()
            timer.arm()
            t0 = timer()
            ref.gelu(x)
            samples.append(timer() - t0)
        event_ms = 1e3 * statistics.median(samples)
        do_bench_ms = triton.testing.do_bench(lambda: ref.gelu(src), return_mode="median")
        out["timer_vs_do_bench"] = {"cuda_event_timer_ms": event_ms, "do_bench_ms": do_bench_ms}
        print(f"  CudaEventTimer {event_ms:.4f} ms vs do_bench {do_bench_ms:.4f} ms")
        REPORT["engine"] = out

    step("engine self-checks", args.limit_s)(engine)
    save()

    # 5. grader bench ------------------------------------------------------------------------------
    def bench_cli():
        plot = (OUT or Path("/tmp")) / "bench_gelu.png"
        cmd = [sys.executable, "-m", "grader.cli", "bench", "gelu", "--impl", "solutions", "--plot", str(plot),
               "--budget-s", "0.5"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        print(proc.stdout[-6000:], proc.stderr[-3000:])
        REPORT["bench"] = {"rc": proc.returncode, "plot": plot.is_file()}
        assert proc.returncode == 0 and plot.is_file()

    step("grader bench gelu --impl solutions --plot", args.limit_s)(bench_cli)
    save()

    # 6. pytest speed tests once ---------------------------------------------------------------------
    def pytest_speed():
        from importlib.metadata import entry_points

        plugin = [] if any(e.name == "grader" for e in entry_points(group="pytest11")) else ["-p", "grader.plugin"]
        json_out = (OUT or Path("/tmp")) / "pytest_speed.json"
        cmd = [sys.executable, "-m", "pytest", *plugin, "assignments/gelu", "assignments/softmax", "--impl",
               "solutions", "-m", "speed", "-rs", "-p", "no:cacheprovider", f"--benchmark-json={json_out}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        print(proc.stdout[-8000:], proc.stderr[-2000:])
        REPORT["pytest"] = {"rc": proc.returncode, "tail": proc.stdout[-1500:]}
        assert proc.returncode == 0

    step("pytest -m speed (gelu, softmax references)", args.limit_s + 60)(pytest_speed)
    return finish()


def finish() -> int:
    save()
    failed = [c for c in REPORT.get("criteria", []) if not c["pass"]]
    errors = [n for n, s in REPORT["steps"].items() if s.get("ok") is False]
    print(f"\ndone in {elapsed():.0f} s; criteria failed: {len(failed)}; steps with errors: {errors}")
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
