"""GPU check of the rmsnorm and matmul reference solutions: correctness at big shapes, then speed.

Run from the repository root on a CUDA machine:

    python scripts/gpu/check_rmsnorm_matmul.py

1. Correctness on CUDA against float64 references, with the exercises' own tolerances
   (grader/exercises/{rmsnorm,matmul}.py): RMSNorm y, dx, dweight at 16384×4096 and 4096×16384 (bf16, fp32);
   matmul at 4096³ bf16/fp16 with and without the GeLU epilogue, 2048³ fp32 (TF32) and transposed inputs.
2. Speed with triton.testing.do_bench (median; the L2 cache is flushed before every run):
   RMSNorm forward vs the PyTorch formula, torch.compile of it and a device copy of x (GB/s, % of copy
   bandwidth); forward+backward vs PyTorch and torch.compile; matmul bf16/fp16 4096³ (+gelu) and 8192³
   bf16 vs torch.matmul (+F.gelu), in TFLOP/s and as a ratio.

Targets (issue 3): RMSNorm forward ≥ 90% of copy bandwidth and faster than torch.compile; matmul bf16 4096³
≥ 0.9× torch.matmul. Prints a table and, if $OUT is set, writes $OUT/rmsnorm_matmul.json.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from grader import runtime  # noqa: E402  (before triton: picks the device)

MODE = runtime.configure()
if not MODE.is_cuda:
    sys.exit("check_rmsnorm_matmul.py needs a CUDA GPU (this machine would use the Triton interpreter)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from grader import exercises, loader  # noqa: E402
from grader.compare import compare  # noqa: E402
from grader.exercises import matmul as mm_spec  # noqa: E402
from grader.exercises import rmsnorm as rms_spec  # noqa: E402

T0 = time.time()
BUDGET_S = 240  # stop timing (not checking) if the run gets near the 5-minute mark
RESULTS: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                 "correctness": [], "rmsnorm": [], "rmsnorm_fwd_warps": [], "matmul": []}
FAILURES: list[str] = []


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def bench(fn) -> float:
    """Median milliseconds of fn() (do_bench flushes L2 before each run)."""
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def over_budget() -> bool:
    return time.time() - T0 > BUDGET_S


# ------------------------------------------------------------------------------------------ load
RMS = loader.load("solutions", exercises.get("rmsnorm"), ("rmsnorm",))
MM = loader.load("solutions", exercises.get("matmul"), ("matmul",))
RMS_FWD_PART = exercises.get("rmsnorm").part("forward")
RMS_BWD_PART = exercises.get("rmsnorm").part("backward")
MM_PART = exercises.get("matmul").part("forward")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def check(label: str, name: str, got: torch.Tensor, expected: torch.Tensor, part, dtype: torch.dtype) -> None:
    """Elementwise |got - expected| <= atol + rtol·|expected| on the GPU (NaN must match NaN); the
    grader's CPU comparison only runs to explain a failure (it is slow at 67M elements)."""
    tol = part.tolerance(name, dtype, "cuda")
    g, e = got.detach().double(), expected.detach().double()
    ok_elem = ((g - e).abs() <= tol.atol + tol.rtol * e.abs()) | (torch.isnan(g) & torch.isnan(e))
    ok = got.dtype == dtype and got.shape == expected.shape and bool(ok_elem.all())
    err = float(torch.nan_to_num((g - e).abs(), nan=float("inf")).max())
    RESULTS["correctness"].append({"case": label, "output": name, "ok": ok, "max_abs_err": err,
                                   "atol": tol.atol, "rtol": tol.rtol})
    log(f"{'ok  ' if ok else 'FAIL'} {label:44} {name:8} max|err| {err:.2e} (atol {tol.atol:g}, rtol {tol.rtol:g})")
    if not ok:
        mismatch = compare(name, got.cpu(), expected.cpu(), tol)
        FAILURES.append(f"{label} {name}:\n{mismatch.message if mismatch else 'dtype/shape'}")


# ----------------------------------------------------------------------------- correctness: rmsnorm
def rms_inputs(rows: int, h: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, h, device="cuda", generator=g).to(dtype)
    w = torch.randn(h, device="cuda", generator=g).to(dtype)
    dy = torch.randn(rows, h, device="cuda", generator=g).to(dtype)
    return x, w, dy


def check_rmsnorm(rows: int, h: int, dtype_name: str, eps: float = 1e-6) -> None:
    dtype = DTYPES[dtype_name]
    x, w, dy = rms_inputs(rows, h, dtype)
    label = f"rmsnorm {rows}x{h} {dtype_name}"
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = RMS.rmsnorm(xg, wg, eps)
    y.backward(dy)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    y64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w64
    y64.backward(dy.double())
    check(label, "y", y.detach(), y64.detach(), RMS_BWD_PART, dtype)
    check(label, "dx", xg.grad, x64.grad, RMS_BWD_PART, dtype)
    check(label, "dweight", wg.grad, w64.grad, RMS_BWD_PART, dtype)


# ------------------------------------------------------------------------------ correctness: matmul
def mm_inputs(m: int, n: int, k: int, dtype: torch.dtype, transpose_a=False, transpose_b=False, seed: int = 0):
    """a ~ N(0, 1), b ~ N(0, 1/K) as in the exercise (|c| ~ 1); transposed = column-major storage."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g)
    b = torch.randn(k, n, device="cuda", generator=g) / math.sqrt(k)
    a = a.t().contiguous().t() if transpose_a else a
    b = b.t().contiguous().t() if transpose_b else b
    return a.to(dtype), b.to(dtype)


def check_matmul(m, n, k, dtype_name, activation=None, transpose_a=False, transpose_b=False) -> None:
    dtype = DTYPES[dtype_name]
    a, b = mm_inputs(m, n, k, dtype, transpose_a, transpose_b)
    layout = ("T" if transpose_a else "N") + ("T" if transpose_b else "N")
    label = f"matmul {m}x{n}x{k} {dtype_name} {layout} {activation or ''}".rstrip()
    c = MM.matmul(a, b, activation=activation)
    ref = mm_spec.reference({"a": a, "b": b, "activation": activation})["c"]
    check(label, "c", c, ref, MM_PART, dtype)


# ------------------------------------------------------------------------------------ speed: rmsnorm
def time_rmsnorm(rows: int, h: int, dtype_name: str, eps: float = 1e-6) -> None:
    dtype = DTYPES[dtype_name]
    x, w, dy = rms_inputs(rows, h, dtype)
    inputs = {"x": x, "weight": w, "dy": dy, "eps": eps}
    s = x.element_size()
    fwd_bytes = rms_spec._forward_bytes(inputs)
    bwd_bytes = rms_spec._backward_bytes(inputs)
    copy_ms = bench(lambda: x.clone())
    row = {"shape": f"{rows}x{h}", "dtype": dtype_name, "copy_ms": copy_ms,
           "copy_GBps": 2 * x.numel() * s / copy_ms / 1e6}
    fwd = {
        "triton": lambda: RMS.rmsnorm(x, w, eps),
        "torch": lambda: rms_spec.FORWARD_BASELINES["torch"](inputs),
        "torch.compile": lambda: rms_spec.FORWARD_BASELINES["torch.compile"](inputs),
    }
    for name, fn in fwd.items():
        ms = bench(fn)
        row[f"fwd_{name}_ms"] = ms
        row[f"fwd_{name}_GBps"] = fwd_bytes / ms / 1e6
    row["fwd_pct_of_copy"] = 100 * row["fwd_triton_GBps"] / row["copy_GBps"]
    row["fwd_speedup_vs_compile"] = row["fwd_torch.compile_ms"] / row["fwd_triton_ms"]

    def triton_fwd_bwd():
        xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
        RMS.rmsnorm(xg, wg, eps).backward(dy)

    fwd_bwd = {
        "triton": triton_fwd_bwd,
        "torch": lambda: rms_spec.BACKWARD_BASELINES["torch"](inputs),
        "torch.compile": lambda: rms_spec.BACKWARD_BASELINES["torch.compile"](inputs),
    }
    for name, fn in fwd_bwd.items():
        ms = bench(fn)
        row[f"fwdbwd_{name}_ms"] = ms
        row[f"fwdbwd_{name}_GBps"] = bwd_bytes / ms / 1e6
    row["fwdbwd_speedup_vs_compile"] = row["fwdbwd_torch.compile_ms"] / row["fwdbwd_triton_ms"]
    RESULTS["rmsnorm"].append(row)
    log(f"rmsnorm {row['shape']} {dtype_name}: fwd {row['fwd_triton_GBps']:.0f} GB/s "
        f"({row['fwd_pct_of_copy']:.1f}% of copy), {row['fwd_speedup_vs_compile']:.2f}x torch.compile")


def sweep_rmsnorm_fwd_warps(rows: int, h: int, dtype_name: str, eps: float = 1e-6) -> None:
    """The forward kernel alone at several num_warps: data for tuning solutions/rmsnorm/_num_warps."""
    dtype = DTYPES[dtype_name]
    x, w, _ = rms_inputs(rows, h, dtype)
    y = torch.empty_like(x)
    rstd = torch.empty(rows, device="cuda", dtype=torch.float32)
    block_n = triton.next_power_of_2(h)
    nbytes = 2 * x.numel() * x.element_size()
    out = {"shape": f"{rows}x{h}", "dtype": dtype_name, "chosen": RMS._num_warps(block_n)}
    for warps in (4, 8, 16, 32):
        fn = lambda warps=warps: RMS._rmsnorm_fwd_kernel[(rows,)](
            x, w, y, rstd, x.stride(0), x.stride(1), y.stride(0), h, eps, BLOCK_N=block_n, num_warps=warps)
        try:
            out[f"warps{warps}_GBps"] = nbytes / bench(fn) / 1e6
        except Exception as exc:  # e.g. out of resources
            out[f"warps{warps}_GBps"] = None
            log(f"  num_warps={warps}: {type(exc).__name__}")
    RESULTS["rmsnorm_fwd_warps"].append(out)
    log(f"rmsnorm fwd {out['shape']} {dtype_name} GB/s by num_warps: "
        + ", ".join(f"{k}={v:.0f}" for k, v in out.items() if k.startswith("warps") and v))


# ------------------------------------------------------------------------------------- speed: matmul
def time_matmul(n: int, dtype_name: str, activation=None) -> None:
    dtype = DTYPES[dtype_name]
    a, b = mm_inputs(n, n, n, dtype)
    flop = 2.0 * n**3
    ms_triton = bench(lambda: MM.matmul(a, b, activation=activation))
    ms_torch = bench(lambda: mm_spec._torch_matmul(a, b, activation))
    row = {"shape": f"{n}^3", "dtype": dtype_name, "activation": activation,
           "triton_ms": ms_triton, "torch_ms": ms_torch,
           "triton_TFLOPs": flop / ms_triton / 1e9, "torch_TFLOPs": flop / ms_torch / 1e9,
           "ratio_vs_torch": ms_torch / ms_triton}
    RESULTS["matmul"].append(row)
    log(f"matmul {n}^3 {dtype_name} {activation or '':4}: {row['triton_TFLOPs']:.0f} TFLOP/s vs torch "
        f"{row['torch_TFLOPs']:.0f} ({row['ratio_vs_torch']:.3f}x)")


def print_tables() -> None:
    print("\n=== RMSNorm (GB/s; fwd bytes = 2·N·s, fwd+bwd bytes = 5·N·s) ===")
    print(f"{'shape':12} {'dtype':9} {'copy':>7} {'triton':>7} {'%copy':>6} {'torch':>7} {'compile':>8} "
          f"{'vs cmp':>7} | {'f+b tri':>8} {'f+b tor':>8} {'f+b cmp':>8} {'vs cmp':>7}")
    for r in RESULTS["rmsnorm"]:
        print(f"{r['shape']:12} {r['dtype']:9} {r['copy_GBps']:7.0f} {r['fwd_triton_GBps']:7.0f} "
              f"{r['fwd_pct_of_copy']:5.1f}% {r['fwd_torch_GBps']:7.0f} {r['fwd_torch.compile_GBps']:8.0f} "
              f"{r['fwd_speedup_vs_compile']:6.2f}x | {r['fwdbwd_triton_GBps']:8.0f} {r['fwdbwd_torch_GBps']:8.0f} "
              f"{r['fwdbwd_torch.compile_GBps']:8.0f} {r['fwdbwd_speedup_vs_compile']:6.2f}x")
    print("\n=== matmul (TFLOP/s) ===")
    print(f"{'shape':8} {'dtype':9} {'act':5} {'triton':>7} {'torch':>7} {'ratio':>6}")
    for r in RESULTS["matmul"]:
        print(f"{r['shape']:8} {r['dtype']:9} {r['activation'] or '-':5} {r['triton_TFLOPs']:7.0f} "
              f"{r['torch_TFLOPs']:7.0f} {r['ratio_vs_torch']:6.3f}")


def main() -> int:
    log(f"{RESULTS['device']}; torch {torch.__version__}, triton {triton.__version__}")

    for rows, h, dt in ((16384, 4096, "bfloat16"), (4096, 16384, "bfloat16"), (16384, 4096, "float32"),
                        (4096, 16384, "float32"), (3, 16384, "float16"), (1000, 7, "float32")):
        check_rmsnorm(rows, h, dt)
    for args, kw in (
        ((4096, 4096, 4096, "bfloat16"), {}),
        ((4096, 4096, 4096, "bfloat16"), {"activation": "gelu"}),
        ((4096, 4096, 4096, "float16"), {}),
        ((4096, 4096, 4096, "float16"), {"activation": "gelu"}),
        ((2048, 2048, 2048, "float32"), {}),
        ((1000, 1000, 1000, "float32"), {"activation": "gelu"}),
        ((2000, 3000, 1500, "bfloat16"), {"transpose_a": True, "activation": "gelu"}),
        ((1024, 1040, 1000, "float16"), {"transpose_b": True}),
        ((1, 1, 1, "float16"), {}),
        ((17, 33, 65, "bfloat16"), {"transpose_a": True, "transpose_b": True}),
    ):
        check_matmul(*args, **kw)

    # matmul first: its configs were autotuned (and compiled) by the checks above, so it is cheap.
    timings = [
        (time_matmul, (4096, "bfloat16")),
        (time_matmul, (4096, "bfloat16", "gelu")),
        (time_matmul, (4096, "float16")),
        (time_matmul, (4096, "float16", "gelu")),
        (time_matmul, (8192, "bfloat16")),
        (time_rmsnorm, (16384, 4096, "bfloat16")),
        (time_rmsnorm, (4096, 16384, "bfloat16")),
        (time_rmsnorm, (16384, 4096, "float32")),
        (time_rmsnorm, (4096, 16384, "float32")),
        (sweep_rmsnorm_fwd_warps, (16384, 4096, "bfloat16")),
        (sweep_rmsnorm_fwd_warps, (4096, 16384, "bfloat16")),
        (sweep_rmsnorm_fwd_warps, (16384, 4096, "float32")),
    ]
    for fn, args in timings:
        if over_budget():
            log(f"time budget reached: skipping {fn.__name__}{args}")
            continue
        try:
            fn(*args)
        except Exception as exc:  # report and go on: one failure should not hide the other numbers
            FAILURES.append(f"{fn.__name__}{args} raised {type(exc).__name__}: {exc}")
            log(f"ERROR {fn.__name__}{args}: {type(exc).__name__}: {exc}")

    print_tables()
    RESULTS["failures"] = FAILURES
    RESULTS["elapsed_s"] = time.time() - T0
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "rmsnorm_matmul.json").write_text(json.dumps(RESULTS, indent=2))
        log(f"wrote {out}/rmsnorm_matmul.json")
    if FAILURES:
        print("\nFAILURES:\n" + "\n\n".join(FAILURES))
        return 1
    log("all correctness checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
