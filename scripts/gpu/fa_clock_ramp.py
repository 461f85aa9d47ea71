"""How long after idle does a kernel reach its steady speed? (an experiment, not part of the grader)

    PYTHONUNBUFFERED=1 python3 scripts/gpu/fa_clock_ramp.py [--idle 5 2 0.5] [--seconds 3]

The autotuner times its candidates one after another, each right after compiling it (seconds of an idle
GPU). If the GPU runs faster for a while after idling (boost clocks with thermal or power headroom),
the first candidate timed is favoured. This script runs the reference solution's forward at the CS336
leaderboard shape (one fixed, compiled config) back to back for ``--seconds`` after each idle gap and
prints the mean time per call in 100 ms windows, with the SM clock where NVML is available. Results:
docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_flash_attention import load  # the benchmark's own loader


def sm_clock() -> str:
    try:
        return f"{torch.cuda.clock_rate()} MHz"
    except Exception:  # no pynvml
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, nargs="*", default=[5.0, 2.0, 0.5], help="idle gaps (s)")
    parser.add_argument("--seconds", type=float, default=3.0, help="busy time after each gap")
    args = parser.parse_args()
    fa = load("solutions")
    fa._FWD[64] = [(128, 128, 4, 3)]  # one config, no autotuning: the kernel is the constant
    fa.AUTOTUNE_MIN_WORK = 1 << 62
    print({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__})
    q, k, v = (torch.randn((1, 16, 16384, 64), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(3):  # compile
        fa.flash_attention_forward(q, k, v, True)
    torch.cuda.synchronize()
    for gap in args.idle:
        time.sleep(gap)
        print(f"after {gap:.1f} s idle (clock now {sm_clock()}):", flush=True)
        windows: list[str] = []
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            begin.record()
            calls = 0
            while time.perf_counter() - t0 < 0.1:  # ~100 ms of calls (the host runs ahead; synchronize below)
                fa.flash_attention_forward(q, k, v, True)
                calls += 1
                if calls % 8 == 0:
                    torch.cuda.synchronize()
            end.record()
            torch.cuda.synchronize()
            windows.append(f"{begin.elapsed_time(end) / calls:.3f}")
        print("  ms/call per window: " + " ".join(windows) + f"  (clock {sm_clock()})", flush=True)


if __name__ == "__main__":
    main()
