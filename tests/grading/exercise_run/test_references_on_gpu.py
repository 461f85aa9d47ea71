"""The grader's float64 references on the slot's GPU (:mod:`grader.grading.exercise_run.gpu_references`): its GPU
work goes through the slot's arbiter like a worker's; what does not fit, or a failed GPU, falls back to the CPU and
never costs a grade; and on a GPU (``-m gpu``) every part's references, the benchmark-size rechecks included,
equal the CPU's."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from grader import exercises
from grader.checks import cases as cases_mod
from grader.checks.spec import Case, Part
from grader.exercises import flash_attention_reference as fa_reference
from grader.grading.exercise_run import gpu_references
from grader.grading.exercise_run.gpu_references import GpuReferences
from grader.grading.exercise_run.slots import Slot
from grader.grading.isolation.gpu_arbiter import GpuArbiter
from grader.speed.measure import recheck_case


def test_the_graders_own_gpu_work_waits_for_a_turn_alone_and_a_turn_waits_for_it():
    arbiter = GpuArbiter()
    synced = []
    gate = arbiter.connect_here("the grader's references", synchronize=lambda: synced.append(time.monotonic()))
    times: dict[str, float] = {}
    in_use, turn_started = threading.Event(), threading.Event()

    def reference() -> None:  # a reference already on the GPU when the turn is asked for
        with gate.use():
            in_use.set()
            time.sleep(0.3)
            times["first ends"] = time.monotonic()

    def turn() -> None:
        with arbiter.alone():
            times["turn starts"] = time.monotonic()
            turn_started.set()
            time.sleep(0.3)
            times["turn ends"] = time.monotonic()

    first = threading.Thread(target=reference)
    first.start()
    in_use.wait(5)
    alone = threading.Thread(target=turn)
    alone.start()
    assert turn_started.wait(5), "the turn never came: the grader's gate did not answer the pause"
    with gate.use():  # a reference asked for during the turn waits for its end
        times["second starts"] = time.monotonic()
    for t in (first, alone):
        t.join(5)
    assert times["turn starts"] >= times["first ends"]
    assert times["second starts"] >= times["turn ends"]
    assert synced and synced[0] >= times["first ends"]  # the GPU work was waited for before the pause was said


def _part(reference=lambda inputs: {"y": inputs["x"].to(torch.float64) * 2}) -> Part:
    return Part(name="fake", functions=("f",), make_inputs=lambda case: {}, call=lambda module, inputs: {},
                reference=reference, cases=lambda device: None, examples=(), tolerances={})


def _refs(monkeypatch, fails_with: BaseException | None) -> GpuReferences:
    refs = GpuReferences(0, GpuArbiter())

    def on_gpu(part, inputs):
        if fails_with is not None:
            raise fails_with
        return {"y": part.reference(inputs)["y"] + 1}  # told apart from the CPU's

    monkeypatch.setattr(refs, "_on_gpu", on_gpu)
    return refs


def test_references_are_taken_from_the_gpu_while_it_answers(monkeypatch):
    refs = _refs(monkeypatch, None)
    assert refs.compute(_part(), {"x": torch.ones(3)})["y"].tolist() == [3.0, 3.0, 3.0]
    assert (refs.on_gpu, refs.on_cpu, refs.broken) == (1, 0, None)


def test_a_reference_too_big_for_the_graders_share_is_computed_on_the_cpu(monkeypatch, capsys):
    refs = _refs(monkeypatch, torch.cuda.OutOfMemoryError("out of memory"))
    for _ in range(2):
        assert refs.compute(_part(), {"x": torch.ones(3)})["y"].tolist() == [2.0, 2.0, 2.0]
    assert (refs.on_gpu, refs.on_cpu, refs.broken) == (0, 2, None)  # the next one tries the GPU again
    assert capsys.readouterr().err.count("does not fit") == 1  # said once per part


def test_a_failed_gpu_sends_every_later_reference_to_the_cpu(monkeypatch, capsys):
    refs = _refs(monkeypatch, RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert refs.compute(_part(), {"x": torch.ones(2)})["y"].tolist() == [2.0, 2.0]
    assert refs.broken is not None and "illegal memory access" in refs.broken
    monkeypatch.setattr(refs, "_on_gpu", lambda part, inputs: pytest.fail("the GPU was tried again"))
    assert refs.compute(_part(), {"x": torch.ones(2)})["y"].tolist() == [2.0, 2.0]
    assert refs.on_cpu == 2
    assert "computing them on the CPU from now on" in capsys.readouterr().err


def test_a_reference_that_fails_on_the_cpu_too_is_its_own_fault_not_the_gpus(monkeypatch):
    refs = _refs(monkeypatch, ValueError("bad shape"))
    broken = _part(lambda inputs: (_ for _ in ()).throw(ValueError("bad shape")))
    with pytest.raises(ValueError, match="bad shape"):
        refs.compute(broken, {"x": torch.ones(2)})
    assert refs.broken is None  # the GPU is still used for the others


def test_the_graders_share_of_a_gpu_is_what_its_runs_leave_at_most_4_gib():
    gib = 1 << 30
    assert gpu_references.share(int(79.6 * gib), 7) == 4 * gib  # an H100 with the default 7 runs
    assert gpu_references.share(24 * gib, 2) == 3 * gib  # 24 GB, 2 runs: what is left beside them and the context
    assert gpu_references.share(int(79.6 * gib), 8) == 0  # --jobs 8 on an H100: no room


def test_a_gpu_its_runs_leave_no_room_on_keeps_the_references_on_the_cpu(monkeypatch, capsys):
    refs = GpuReferences(0, GpuArbiter(), runs=8)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("Props", (), {"total_memory": int(79.6 * (1 << 30))})())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda *a: pytest.fail("the grader took a share of a GPU with no room"))
    assert refs.compute(_part(), {"x": torch.ones(2)})["y"].tolist() == [2.0, 2.0]
    assert refs.on_cpu == 1 and refs.broken is not None and "8 run(s)" in refs.broken
    assert "stay on the CPU" in capsys.readouterr().err


def test_the_graders_memory_cap_holds_for_a_reference_and_is_lifted_after_it(monkeypatch):
    """The cap is the whole process's: left in force, it would hold every later user of that GPU in the process (a
    test, another part's baseline) to the grader's 4 GiB."""
    import contextlib

    from grader.checks import gpu_gate

    events = []
    refs = GpuReferences(0, GpuArbiter(), runs=1)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("Props", (), {"total_memory": 100 << 30})())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device: events.append(f"cap {f}"))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(refs._arbiter, "connect_here", lambda *a, **k: gpu_gate.NO_GATE)
    part = _part(lambda inputs: events.append("reference") or {"y": torch.zeros(1)})
    refs.compute(part, {})
    failing = _part(lambda inputs: (events.append("reference"), (_ for _ in ()).throw(torch.cuda.OutOfMemoryError())))
    with contextlib.suppress(Exception):
        refs.compute(failing, {})  # the CPU computes it again, and fails the same way: the cap is lifted anyway
    assert events == ["cap 0.04", "reference", "cap 1.0", "cap 0.04", "reference", "cap 1.0", "reference"]


def test_a_gpu_slot_has_one_reference_device_shared_by_its_runs_and_a_cpu_slot_none():
    gpu = Slot("cuda:0", {"kind": "cuda", "index": 0})
    assert gpu_references.for_slot(gpu) is gpu_references.for_slot(gpu) is gpu_references.of(gpu.arbiter)
    assert gpu_references.for_slot(Slot("cpu-0", {"kind": "cpu"})) is None
    assert gpu_references.for_slot(None) is None


def test_flash_attention_references_in_chunks_equal_the_whole_matrix(monkeypatch):
    g = torch.Generator().manual_seed(1)
    inputs = {"q": torch.randn(2, 3, 33, 16, generator=g), "k": torch.randn(2, 3, 20, 16, generator=g),
              "v": torch.randn(2, 3, 20, 16, generator=g), "do": torch.randn(2, 3, 33, 16, generator=g),
              "causal": True, "scale": None, "d": 16}
    whole = fa_reference.autograd_reference(inputs)
    monkeypatch.setattr(fa_reference, "CHUNK_BYTES", 33 * 20 * 8)  # one (batch, head) row a chunk: 6 chunks
    assert len(fa_reference._chunks(fa_reference._rows(inputs["q"]), fa_reference._rows(inputs["k"]))) == 6
    chunked = fa_reference.autograd_reference(inputs)
    q, k, v = (inputs[n].double().requires_grad_(True) for n in ("q", "k", "v"))
    s = (q @ k.transpose(-1, -2)) * 16 ** -0.5
    s = s.masked_fill(torch.ones(33, 20, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(s, dim=-1) @ v
    o.backward(inputs["do"].double())
    for name, expected in {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}.items():
        torch.testing.assert_close(chunked[name], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(whole[name], expected, rtol=1e-12, atol=1e-12)


def _cases(part: Part) -> list[Case]:
    drawn = cases_mod.draw(part, "cuda", 6, 1234)
    rechecks = [recheck_case(part, 99)] if part.speed_graded else []  # benchmark size, as grading draws it
    return [*drawn, *(e.with_seed(7) for e in part.examples[:4]), *rechecks]


@pytest.mark.gpu
@pytest.mark.parametrize("exercise", [e.name for e in exercises.all_exercises()])
def test_gpu_references_equal_the_cpus(exercise):
    refs = GpuReferences(torch.cuda.current_device(), GpuArbiter())
    for part in exercises.get(exercise).parts:
        for case in _cases(part):
            inputs = part.make_inputs(case)
            on_cpu, on_gpu = part.reference(inputs), refs.compute(part, inputs)
            assert on_gpu.keys() == on_cpu.keys()
            for name, expected in on_cpu.items():
                got = on_gpu[name]
                assert got.device.type == "cpu" and got.dtype == expected.dtype, f"{part.name} {name}"
                finite = expected[expected.isfinite()]
                scale = float(finite.abs().max()) if finite.numel() else 1.0  # sums cancel: errors scale with it
                torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12 * max(1.0, scale), equal_nan=True,
                                           msg=lambda m, p=part.name, n=name, c=case: f"{p} {n} {c.label}: {m}")
    assert refs.broken is None and refs.on_cpu == 0  # every one, the benchmark-size rechecks too, fit the GPU
