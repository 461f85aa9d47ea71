"""``grader profile`` on the CPU: the launches of one call, for the references, a slowed fixture and PyTorch (the
times need a GPU, and the command says so)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grader import cli, exercises
from grader.checks import loader, runtime
from grader.checks.tensors import device_inputs
from grader.speed import launches as launches_mod
from grader.speed import profile
from grader.speed.launches import Launch

from ..known_wrong import slowed

ROOT = Path(__file__).resolve().parents[2]
SOFTMAX = exercises.get("softmax")
FORWARD = SOFTMAX.part("forward")


def _module(root: Path, exercise=SOFTMAX):
    return loader.load(root, exercise, tuple(f for p in exercise.parts for f in p.functions))


def _three_passes():
    fixture = next(f for f in slowed() if f.id == "softmax/three_passes")
    return _module(fixture.root)


def _profiles(module) -> dict[str, profile.CallProfile]:
    _, profiles, skipped = profile.profile_part(FORWARD, module, _module(ROOT / "solutions"),
                                                device=runtime.configure().device)
    assert any(s.startswith("torch.compile:") for s in skipped)  # not on a CPU, and said why
    return {p.candidate: p for p in profiles}


def test_three_passes_launch_more_than_the_reference_and_unfused_pytorch_more_still():
    slow = _profiles(_three_passes())
    yours, reference, unfused = (slow[n].launches for n in (profile.YOURS, profile.REFERENCE, profile.UNFUSED))
    assert [x.kind for x in reference] == ["triton"] and len(yours) == 3 and {x.kind for x in yours} == {"triton"}
    assert len(unfused) > len(yours) > len(reference)
    assert [x.name for x in unfused] == ["amax", "sub", "exp", "sum", "div"]
    assert all(x.kind == "torch" and x.nbytes > 0 for x in unfused)
    # the same kernel three times over the same tensors: launches 2 and 3 move again what launch 1 moved
    assert [(i, j) for i, j, _ in profile.reread_bytes(yours)] == [(1, 0), (2, 0)]
    assert all(nbytes == yours[0].nbytes for _, _, nbytes in profile.reread_bytes(yours))
    words = profile.reading(list(slow.values()))
    assert "your call launches 3 Triton kernels" in words
    assert "the reference launches 1 kernel (2 fewer than yours)" in words
    assert any("each of your 2 extra launches is another pass over memory" in w for w in words)
    assert "torch (unfused) launches 5 kernels: fusing saves 2 round trips to global memory" in words
    assert any(w.startswith("your launch 2 (") and "is handed again" in w for w in words)


def test_the_reference_launches_one_kernel_per_row_block_and_moves_its_tensors_once():
    ref = _profiles(_module(ROOT / "solutions"))
    (launch,) = ref[profile.YOURS].launches
    case, _ = profile.profile_case(FORWARD, "cpu", None)
    x = FORWARD.make_inputs(case)["x"]
    rows = x.numel() // x.shape[-1]
    assert launch.grid is not None and launch.grid[0] == rows  # one program per row
    assert launch.nbytes == 2 * x.numel() * x.element_size()  # x in, y out: nothing else handed to it
    assert profile.reread_bytes(ref[profile.YOURS].launches) == []
    assert "the reference launches 1 kernel (the same number)" in profile.reading(list(ref.values()))


def test_a_stub_that_is_not_written_yet_is_said_so(capsys):
    failed = _profiles(_module(ROOT / "assignments"))
    assert failed[profile.YOURS].error and "NotImplementedError" in failed[profile.YOURS].error
    assert profile.reading(list(failed.values()))[0].startswith("your call failed: NotImplementedError")


def test_grader_profile_on_a_cpu_shows_the_launches_and_says_times_need_a_gpu(capsys, tmp_path):
    assert cli.main(["profile", "softmax", "--impl", str(ROOT / "solutions")]) == 0
    out = capsys.readouterr().out
    assert "1 launch per call" in out and "_softmax" in out and "amax" in out
    assert "times need a GPU" in out
    assert cli.main(["profile", "softmax", "--trace", str(tmp_path / "t.json")]) == 2
    assert "--trace needs a GPU" in capsys.readouterr().err
    assert cli.main(["profile", "nope"]) == 2


@pytest.mark.parametrize("name", [e.name for e in exercises.all_exercises()])
def test_every_reference_profiles_on_the_cpu(name):
    exercise = exercises.get(name)
    module, reference = _module(ROOT / "solutions", exercise), None
    for part in exercise.parts:
        _, profiles, _ = profile.profile_part(part, module, reference, device="cpu")
        yours = next(p for p in profiles if p.candidate == profile.YOURS)
        assert yours.error is None and any(x.kind == "triton" for x in yours.launches), (part.name, yours.error)


@pytest.mark.parametrize("name", [e.name for e in exercises.all_exercises()])
def test_the_reference_launches_what_its_spec_declares_at_every_benchmark(name):
    """``Part.reference_launches``, which a slow part's report puts beside the student's launches, is what the
    reference solution's call launches: recorded on the example most like each benchmark."""
    exercise = exercises.get(name)
    solutions = _module(ROOT / "solutions", exercise)
    device = runtime.configure().device
    declared = [p for p in exercise.parts if p.reference_launches is not None]
    assert declared == [p for p in exercise.parts if p.benchmarks], "every part with benchmarks declares its count"
    for part in declared:
        for bench in part.benchmarks:
            case, _ = profile.profile_case(part, "cpu", bench.label)  # a small example like it, on any device
            part.call(solutions, device_inputs(part.make_inputs(case), device))  # compiles and autotunes
            fresh = device_inputs(part.make_inputs(case), device)
            with launches_mod.record() as found:
                part.call(solutions, fresh)
            triton = [x.name for x in found if x.kind == "triton"]
            assert len(triton) == part.reference_launches, (part.name, bench.label, triton)


def test_the_matmul_epilogue_is_one_launch_where_pytorch_makes_two():
    matmul = exercises.get("matmul")
    part = matmul.parts[0]
    case, name = profile.profile_case(part, "cpu", "4096³ bf16 + gelu")
    assert case["activation"] == "gelu" and "like benchmark 4096³ bf16 + gelu" in name
    _, profiles, _ = profile.profile_part(part, _module(ROOT / "solutions", matmul), None, device="cpu",
                                          label="4096³ bf16 + gelu")
    by_name = {p.candidate: p for p in profiles}
    assert [x.kind for x in by_name[profile.YOURS].launches] == ["triton"]
    assert [x.name for x in by_name["torch"].launches] == ["mm", "gelu"]
    assert "torch launches 2 kernels: fusing saves 1 round trip to global memory" in profile.reading(profiles)
    with pytest.raises(KeyError, match="has no benchmark nope"):
        profile.profile_case(part, "cpu", "nope")


def _event(name: str, start: float, end: float, device_us: float = 0.0):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_time_total=device_us)


def test_gpu_times_go_to_the_launch_that_ran_them():
    """On a GPU each launch gets the time the profiler saw for it: a Triton launch the next kernel of its name, a
    PyTorch op the device time of the next ``aten::`` event of its name (not one nested inside an earlier op)."""
    launches = [Launch("torch", "_to_copy", None), Launch("triton", "_k", (4,)), Launch("torch", "copy_", None),
                Launch("triton", "_k", (4,))]
    timed = launches_mod._TimedCall(
        kernels=[("elementwise_copy", 0.010), ("_k", 0.200), ("elementwise_copy", 0.030), ("_k", 0.300)],
        ops=[_event("aten::_to_copy", 0, 10, 10.0), _event("aten::copy_", 2, 9, 10.0),  # nested in _to_copy
             _event("aten::copy_", 20, 25, 30.0)])
    assert launches_mod._launch_times(launches, timed) == [0.010, 0.200, 0.030, 0.300]
    missing = launches_mod._launch_times([Launch("torch", "mm", None)], timed)
    assert missing == [None]  # an op the profiler did not see has no time, rather than another op's


def test_a_descriptor_argument_counts_the_tensor_it_describes():
    """A host-side TMA descriptor (Hopper's FlashAttention passes q, k, v that way) hands its kernel its tensor."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.zeros(4, 16, 64)
    desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 16, 64])
    assert launches_mod._storages([desc]) == {x.untyped_storage().data_ptr(): x.nbytes}


def test_kernels_that_overlap_show_the_calls_span_beside_their_sum():
    overlapped = launches_mod.CallProfile("yours", gpu_ms=0.915, span_ms=0.817)
    assert "spans 817.0 µs" in profile.gpu_caption(overlapped) and "915.5" not in profile.gpu_caption(overlapped)
    serial = launches_mod.CallProfile("yours", gpu_ms=0.200, span_ms=0.199)
    assert "spans" not in profile.gpu_caption(serial) and "200.0 µs of GPU time" in profile.gpu_caption(serial)


@pytest.mark.gpu
def test_on_a_gpu_every_launch_is_timed_and_the_flash_attention_backward_kernels_overlap_as_benchmarked():
    """On a GPU: the three-pass softmax's three kernels each get a time, and together take longer than the
    reference's one; FlashAttention's forward + backward launches its four kernels, each timed, and the dK/dV and dQ
    kernels, on two streams, overlap (the call's span is under the kernels' sum) because each profiled call is
    queued whole before it starts, as ``grader bench`` times it."""
    _, profiles, _ = profile.profile_part(FORWARD, _three_passes(), _module(ROOT / "solutions"), device="cuda")
    by_name = {p.candidate: p for p in profiles}
    slow, reference = by_name[profile.YOURS], by_name[profile.REFERENCE]
    assert len(slow.launches) == 3 and all(x.ms and x.ms > 0 for x in slow.launches)
    assert len(reference.launches) == 1 and reference.gpu_ms < slow.gpu_ms

    fa = exercises.get("flash_attention")
    solutions = _module(ROOT / "solutions", fa)
    _, profiles, _ = profile.profile_part(fa.part("autograd"), solutions, None, device="cuda",
                                          label="b8h16-n2048-d64-causal")
    yours = next(p for p in profiles if p.candidate == profile.YOURS)
    assert yours.error is None and len(yours.launches) == 4
    assert all(x.ms and x.ms > 0 for x in yours.launches)
    assert yours.span_ms < 0.98 * yours.gpu_ms, (yours.span_ms, yours.gpu_ms)
