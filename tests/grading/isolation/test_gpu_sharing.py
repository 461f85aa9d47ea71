"""GPU acceptance (``pytest -m gpu``) of what lets many runs share one GPU: a turn alone waits for the kernels
another process already queued (the pause synchronizes it), while a process that is only compiling is no reason
to wait; and correctness calls compile a kernel once per dtype instead of once per shape
(grader.checks.specialization). Skipped on a CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from grader.grading.isolation.gpu_arbiter import GpuArbiter

PROCESS = textwrap.dedent("""
    import sys, time, torch
    from grader.checks import gpu_gate
    r, w = map(int, sys.argv[1].split(","))
    gate = gpu_gate.Gate(r, w)
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    print("ready", flush=True)
    with gate.use():
        torch.cuda._sleep(int(sys.argv[2]))  # a long kernel, queued: the call returns at once
    print("queued", flush=True)
    time.sleep(30)  # alive, its stretch over, its kernel still running
""")


def _env() -> dict[str, str]:
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


@pytest.mark.gpu
def test_a_turn_alone_waits_for_the_kernels_another_process_queued():
    import torch

    torch.zeros(1, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(100_000_000)
    end.record()
    end.synchronize()
    cycles_per_ms = 100_000_000 / start.elapsed_time(end)
    arbiter = GpuArbiter()
    client = arbiter.connect("sleeper")
    process = subprocess.Popen([sys.executable, "-c", PROCESS, ",".join(map(str, client.process_fds)),
                                str(int(1500 * cycles_per_ms))], stdout=subprocess.PIPE, text=True,
                               pass_fds=client.process_fds, env=_env())
    client.started()
    try:
        assert process.stdout.readline().strip() == "ready"
        assert process.stdout.readline().strip() == "queued"  # 1.5 s of GPU work queued, its stretch over
        asked = time.monotonic()
        with arbiter.alone():
            waited = time.monotonic() - asked
    finally:
        process.kill()
        process.wait()
        client.close()
    assert waited > 1.0, waited  # the turn started once the queued kernel had finished


@pytest.mark.gpu
def test_correctness_calls_compile_once_per_dtype_not_once_per_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    code = textwrap.dedent("""
        import torch, triton, triton.language as tl
        import triton.compiler as tc
        from grader.checks import specialization
        count = [0]
        compile_kernel = tc.compile
        def counted(*a, **k):
            count[0] += 1
            return compile_kernel(*a, **k)
        tc.compile = counted
        specialization.install()

        @triton.jit
        def add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

        def call(n, offset):
            x = torch.randn(n + offset, device="cuda")[offset:]
            y = torch.empty_like(x)
            add_one[(triton.cdiv(n, 128),)](x, y, n, BLOCK=128)
            assert torch.equal(y, x + 1)

        shapes = [(1, 0), (16, 0), (100, 0), (128, 1), (1000, 3), (4096, 0)]
        with specialization.generic():
            for n, offset in shapes:
                call(n, offset)
        generic = count[0]
        for n, offset in shapes:
            call(n, offset)
        print(generic, count[0] - generic)
    """)
    script = tmp_path / "compile_count.py"  # a file: triton.jit reads the kernel's source from it
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.split()
    generic, specialized = map(int, out)
    assert generic == 1 and specialized >= 3, (generic, specialized)


WAITER = textwrap.dedent("""
    import ctypes, resource, sys, time
    from grader.checks import runtime
    asked = sys.argv[1] == "sleep" and runtime.sleep_while_waiting()
    import torch
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    flags = ctypes.c_uint()
    ctypes.CDLL("libcuda.so.1").cuCtxGetFlags(ctypes.byref(flags))
    def cpu():
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        return usage.ru_utime + usage.ru_stime
    torch.cuda._sleep(2_000_000_000)  # a kernel of about a second, queued
    wall, before = time.monotonic(), cpu()
    torch.cuda.synchronize()
    print(asked, flags.value & 0x07, (cpu() - before) / (time.monotonic() - wall))
""")


@pytest.mark.gpu
def test_a_worker_sleeps_while_it_waits_for_the_gpu():
    """``runtime.sleep_while_waiting`` (a worker, before its CUDA context): its thread sleeps while it waits for its
    GPU work; without it, CUDA spins a core the whole wait (what twenty processes on one GPU would cost)."""
    seen = {}
    for how in ("sleep", "spin"):
        out = subprocess.run([sys.executable, "-c", WAITER, how], capture_output=True, text=True, env=_env(),
                             timeout=120)
        assert out.returncode == 0, out.stderr
        asked, flags, cpu_share = out.stdout.split()
        seen[how] = (asked, int(flags), float(cpu_share))
    assert seen["sleep"][:2] == ("True", 4), seen  # CU_CTX_SCHED_BLOCKING_SYNC
    assert seen["sleep"][2] < 0.2 < 0.8 < seen["spin"][2], seen


def test_starting_cuda_ahead_where_there_is_none_says_why_and_raises_nothing():
    """``runtime.start_cuda`` (a worker, before its first request): where CUDA cannot start, the worker goes on and
    the first case meets and reports the error, as it would have without it."""
    import torch

    from grader.checks import runtime

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: CUDA starts here (a batch's profile shows where the context is made)")
    why = runtime.start_cuda()
    assert why is not None and "CUDA" in why, why
