"""The trusted timer on a CPU: it shares nothing with the student's process, refuses every plan that would touch
memory it does not own, tells a plan that cannot be replayed apart from a grader fault, and checks a replay's
outputs against the baseline; it prepares its jobs as soon as they are recorded and times them only when every
worker has ended, and a crash or hang while it prepares is charged to the benchmark whose kernels ran.
(Recording and replaying kernels need a GPU: tests/speed/test_gpu_trusted_timer.py.)"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grader.grading.config import RunSettings
from grader.grading.exercise_run import timer_process
from grader.grading.isolation import protocol, wire
from grader.speed import plan as plan_mod
from grader.speed import plan_checks, timer, trusted
from grader.speed.measure import BenchmarkTiming, SpeedMeasurement
from grader.speed.plan import Arg, Buffer, LaunchPlan, Step, View
from tests.plans import toy_plan

INPUTS = {"x": 4096}  # the toy plan's input: 1024 float32


def _settings(tmp_path, **changes) -> RunSettings:
    settings = RunSettings(device="cuda", secret="", random_cases=0, timeout_s=60.0, call_timeout_s=30.0,
                           memory_mb=None, speed_budget_s=1.0, workdir=tmp_path)
    return dataclasses.replace(settings, **changes)


def _problems(plan: LaunchPlan) -> list[str]:
    return plan_checks.problems(plan, INPUTS, output_names=("y",))


def _with_launch(plan: LaunchPlan, **changes) -> LaunchPlan:
    return dataclasses.replace(plan, steps=[dataclasses.replace(plan.steps[0], **changes)])


def _with_arg(plan: LaunchPlan, index: int, arg: Arg) -> LaunchPlan:
    args = list(plan.steps[0].args)
    args[index] = arg
    return _with_launch(plan, args=tuple(args))


# ------------------------------------------------------------------------------------------ the process boundary


def test_the_timer_imports_nothing_that_imports_student_code():
    """The timer's whole import closure, in a fresh interpreter: no loader, no worker, no recorder, no grading."""
    code = ("import sys, grader.speed.timer, grader.speed.trusted, grader.exercises; "
            "print('\\n'.join(f'{n} {getattr(m, \"__file__\", None)}' for n, m in sorted(sys.modules.items())))")
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    modules = dict(line.split(" ", 1) for line in lines)
    assert "grader.speed.timer" in modules and "grader.speed.replay" in modules
    for forbidden in ("grader.checks.loader", "grader.grading.isolation.worker", "grader.speed.recorder",
                      "grader.grading", "grader.pytest_plugin"):
        assert forbidden not in modules, f"the timer imports {forbidden}"
    repo = Path(__file__).resolve().parents[2]
    students = [str(repo / folder) for folder in ("assignments", "solutions", "tests")]
    assert not [n for n, f in modules.items() if f.startswith(tuple(students))], "the timer imports student code"


def test_the_timers_sandbox_shows_it_no_submission(tmp_path, monkeypatch):
    """The timer's bubblewrap command binds the grader package and its own scratch, nothing of the student's."""
    from grader.grading.isolation import bwrap

    seen = {}

    class Box:
        def command(self, argv, *, binds, env, cwd):
            seen["binds"], seen["argv"] = list(binds), list(argv)
            return ["true"]

    settings = _settings(tmp_path, sandbox=Box())
    with pytest.raises(timer_process.TimerFault, match="before replaying anything"):
        timer_process.time_measurement(settings, "gelu", "forward", SpeedMeasurement(
            "GPU", [BenchmarkTiming("fp32-4096x8192")], plans={"fp32-4096x8192": toy_plan()}), budget_s=1.0,
            scratch=tmp_path / "scratch")
    binds = {b.dest: b.source for b in seen["binds"]}
    assert set(binds) == {bwrap.PACKAGE, bwrap.SCRATCH, bwrap.TRITON_CACHE}
    assert bwrap.SUBMISSION not in binds
    # its Triton cache is the batch's timer cache, in the grader's workspace: never a student's
    assert binds[bwrap.TRITON_CACHE] == str(settings.workdir / timer_process.TIMER_CACHE)
    assert "grader.speed.timer" in " ".join(seen["argv"])


def test_a_timer_that_dies_before_any_replay_is_the_graders_fault_and_after_one_the_students(tmp_path, monkeypatch):
    settings = _settings(tmp_path)
    measurement = SpeedMeasurement("GPU", [BenchmarkTiming("fp32-4096x8192")], plans={"fp32-4096x8192": toy_plan()})
    monkeypatch.setattr(timer_process, "_BOOT", "import sys; sys.exit(3)")
    with pytest.raises(timer_process.TimerFault, match=r"before replaying anything \(exit 3\)"):
        timer_process.time_measurement(settings, "gelu", "forward", measurement, budget_s=1.0, scratch=tmp_path)
    # a timer that started replaying the student's kernels and then crashed: the student's benchmark fails
    boot = (f"import sys, pathlib; p = pathlib.Path(sys.argv[3]).parent / {timer.PROGRESS!r}; "
            "p.write_text('0 fp32-4096x8192\\n'); import os; os.abort()")
    monkeypatch.setattr(timer_process, "_BOOT", boot)
    timed = timer_process.time_measurement(settings, "gelu", "forward", measurement, budget_s=1.0, scratch=tmp_path)
    assert timed.benchmarks[0].error.startswith("the replayed kernels crashed the timer")


def test_the_timer_has_the_gpu_alone_only_for_its_timed_rounds(tmp_path, monkeypatch):
    """The timer is connected to the GPU's arbiter and asks for the GPU alone around the timed rounds: a stand-in
    timer speaks the gate's protocol (told it may use the GPU, asks, is granted, gives it back) and the arbiter
    counts one turn."""
    from grader.grading.isolation.gpu_arbiter import GpuArbiter

    arbiter = GpuArbiter()
    row = BenchmarkTiming("fp32-4096x8192", times={}).to_dict()
    result = json.dumps(timer.TimerResult("GPU", [row]).to_dict())
    boot = ("import sys, os, pathlib; r, w = map(int, sys.argv[-1].split(',')); assert os.read(r, 1) == b'C'; "
            "os.write(w, b'A'); assert os.read(r, 1) == b'G'; "
            "pathlib.Path(sys.argv[3]).with_name('granted').write_text('1'); "
            f"os.write(w, b'R'); pathlib.Path(sys.argv[3]).write_text({result!r})")
    monkeypatch.setattr(timer_process, "_BOOT", boot)
    measurement = SpeedMeasurement("GPU", [BenchmarkTiming("fp32-4096x8192")], plans={"fp32-4096x8192": toy_plan()})
    timed = timer_process.time_measurement(_settings(tmp_path), "gelu", "forward", measurement, budget_s=1.0,
                                           scratch=tmp_path, arbiter=arbiter)
    assert [r.label for r in timed.benchmarks] == ["fp32-4096x8192"] and timed.timer_fault is None
    assert arbiter.alone_count == 1


def test_a_call_that_cannot_be_replayed_is_not_measurable_without_starting_a_timer(tmp_path):
    measurement = SpeedMeasurement("GPU", [BenchmarkTiming("fp32-4096x8192")],
                                   plans={"fp32-4096x8192": "the call runs the PyTorch op aten.exp"})
    timed = timer_process.time_measurement(_settings(tmp_path), "gelu", "forward",
                                           measurement, budget_s=1.0, scratch=tmp_path)
    assert timed.benchmarks[0].error == "not measurable: the call runs the PyTorch op aten.exp"
    assert not list(tmp_path.iterdir())  # no timer was started


def test_a_malformed_job_is_reported_by_the_timer(tmp_path):
    (tmp_path / "job.json").write_text(json.dumps({"exercise": "gelu", "part": "forward", "budget_s": 1.0,
                                                   "plans": {"x": {"kernels": "nope"}}}))
    assert timer.main([str(tmp_path / "job.json"), str(tmp_path / "result.json")]) == 0
    result = timer.TimerResult.from_dict(json.loads((tmp_path / "result.json").read_text()))
    assert result.error and "malformed" in result.error


# ------------------------------------------------------------------------------------------ plans


def test_a_plan_survives_the_wire_and_a_forged_one_becomes_not_measurable():
    plan = toy_plan()
    assert LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    reply = protocol.SpeedDone("s", SpeedMeasurement("GPU", plans={"a": plan, "b": "why not", "c": toy_plan()}))
    data = wire.encode(reply)
    data["plans"]["c"]["steps"] = "not steps"
    decoded = wire.decode(data).measurement.plans
    assert decoded["a"] == plan and decoded["b"] == "why not"
    assert decoded["c"].startswith("the recorded launches are malformed")


def test_a_recorded_plan_is_replayable():
    assert _problems(toy_plan()) == []


@pytest.mark.parametrize(("change", "message"), [
    (lambda p: _with_arg(p, 1, Arg("tensor", View(1, 8, "float32", (1024,), (1,)))), "outside it"),
    (lambda p: _with_arg(p, 0, Arg("tensor", View(0, 0, "float32", (1024,), (-1,)))), "outside it"),
    (lambda p: _with_arg(p, 0, Arg("tensor", View(0, 0, "float32", (2, 1024), (2048, 1)))), "outside it"),
    (lambda p: _with_arg(p, 0, Arg("tensor", View(7, 0, "float32", (4,), (1,)))), "buffer 7 does not exist"),
    (lambda p: _with_arg(p, 0, Arg("scalar", value=12345678)), "is a pointer"),
    (lambda p: _with_arg(p, 2, Arg("tensor", View(0, 0, "float32", (4,), (1,)))), "i32 scalar"),
    (lambda p: _with_launch(p, grid=(0, 1, 1)), "grid"),
    (lambda p: _with_launch(p, kernel=3), "kernel 3 does not exist"),
    (lambda p: _with_launch(p, args=p.steps[0].args[:2]), "takes 4 arguments"),
    (lambda p: dataclasses.replace(p, buffers=[Buffer("input", 4096, "w"), p.buffers[1]]), "input 'w'"),
    (lambda p: dataclasses.replace(p, buffers=[Buffer("input", 8192, "x"), p.buffers[1]]), "has 8192 bytes"),
    (lambda p: dataclasses.replace(p, buffers=[p.buffers[0], Buffer("output", 1 << 40)]), "MiB of outputs"),
    (lambda p: dataclasses.replace(p, steps=p.steps * (plan_mod.MAX_STEPS + 1)), None),
    (lambda p: dataclasses.replace(p, steps=[Step("wait", 1, event=0), *p.steps]), "no earlier step records"),
    (lambda p: dataclasses.replace(p, steps=[Step("syscall"), *p.steps]), "not a step the timer replays"),
    (lambda p: dataclasses.replace(p, outputs={"y": View(0, 0, "float32", (1024,), (1,))}), "not in an output"),
    (lambda p: dataclasses.replace(p, kernels=[dataclasses.replace(
        p.kernels[0], signature={**p.kernels[0].signature, "n": 'i32"); system("id'})]), "type the timer"),
    (lambda p: dataclasses.replace(p, kernels=[dataclasses.replace(p.kernels[0], name="k(); evil")]),
     "malformed name"),
])
def test_a_plan_that_would_touch_memory_it_does_not_own_is_refused(change, message):
    plan = change(toy_plan())
    if message is None:  # too many steps: refused when read
        with pytest.raises(plan_mod.PlanError, match="at most"):
            LaunchPlan.from_dict(plan.to_dict())
        return
    found = _problems(plan)
    assert any(message in p for p in found), found


def test_a_descriptor_that_reaches_past_its_buffer_is_refused():
    base = View(0, 0, "float32", (32, 32), (32, 1))
    plan = toy_plan()
    kernel = dataclasses.replace(plan.kernels[0], signature={"x_desc": "tensordesc<fp32[16, 16]>", "y_ptr": "*fp32",
                                                              "n": "i32", "BLOCK": "constexpr"})
    ok = Arg("descriptor", base, shape=(32, 32), strides=(32, 1), block_shape=(16, 16))
    plan = dataclasses.replace(plan, kernels=[kernel])
    assert _problems(_with_arg(plan, 0, ok)) == []
    too_far = dataclasses.replace(ok, shape=(64, 32))
    assert any("descriptor extent" in p for p in _problems(_with_arg(plan, 0, too_far)))


# ------------------------------------------------------------------------------------------ validation


def test_the_replay_check_tells_a_right_output_from_a_wrong_or_unwritten_one():
    want = {"y": torch.randn(64, 64)}
    assert trusted.compare({"y": want["y"] + 1e-4 * torch.randn(64, 64)}, want) is None
    half = want["y"].clone()
    half[32:] = 0
    assert "differs from the baseline's" in trusted.compare({"y": half}, want)
    unwritten = want["y"].clone()
    unwritten[5, 5] = float("nan")
    assert "1 of 4096 elements are NaN" in trusted.compare({"y": unwritten}, want)
    assert "has no output 'y'" in trusted.compare({}, want)
    assert "shape" in trusted.compare({"y": want["y"][:10]}, want)


def test_a_baselines_result_is_named_like_the_parts_outputs():
    t = torch.ones(2)
    assert trusted.baseline_outputs(t, ["y"]) == {"y": t}
    assert trusted.baseline_outputs((t, t), ["dx", "dw"]).keys() == {"dx", "dw"}
    assert trusted.baseline_outputs({"o": t, "n": 3}, ["o"]) == {"o": t}


def test_a_mismatch_costs_the_speed_credit_with_a_flag(monkeypatch):
    from tests.speed.test_speed_trust import _judge_speed, _measurement, _thresholds

    measurement = _measurement(0.094, 0.0937)
    measurement.mismatches = ["fp32-4096x8192: output 'y': 524288 of 33554432 elements are NaN/inf"]
    _, state = _judge_speed(measurement, monkeypatch, _thresholds())
    assert state.speed.fraction == 0.0 and state.speed.status == "flagged"
    assert state.flags[trusted.REPLAY_MISMATCH]["scope"] == "speed"
    assert "did not compute the function" in state.speed.message


def test_a_replay_that_is_wrong_like_the_students_own_call_is_a_wrong_result_not_a_flag():
    """The replay's mismatch is evidence against the replay only when the student's own call on fresh inputs (the
    recheck) is right: a kernel that is merely wrong is wrong replayed too, and earns no speed credit, unflagged."""
    from grader.speed import credit
    from tests.speed.test_speed_trust import PART, _measurement, _thresholds

    measurement = _measurement(0.094, 0.0937)
    measurement.mismatches = ["fp32-4096x8192: output 'lse': dtype torch.bfloat16, expected torch.float32"]
    wrong = credit.Verdict(False, "on fresh inputs after the timed runs, lse: dtype torch.bfloat16")
    verdict = credit.judge(PART, measurement, recheck=wrong, thresholds=_thresholds(), require_calibration=False)
    assert verdict.flags == [] and verdict.fraction == 0.0 and "lse: dtype" in verdict.message
    right = credit.judge(PART, measurement, recheck=credit.Verdict(True), thresholds=_thresholds(),
                         require_calibration=False)
    assert [rule for rule, _ in right.flags] == [trusted.REPLAY_MISMATCH]


def test_a_timer_fault_makes_the_speed_wait_for_a_regrade(monkeypatch):
    from tests.speed.test_speed_trust import _judge_speed, _measurement, _thresholds

    measurement = _measurement(0.094, 0.0937)
    measurement.timer_fault = "TimerFault: the timer ended before replaying anything"
    _, state = _judge_speed(measurement, monkeypatch, _thresholds())
    assert state.speed.status == "needs regrade" and state.errors



def test_every_cheat_is_a_right_gelu_where_nothing_is_timed(tmp_path):
    """The forgeries of tests/cheating are graded on the GPU against their honest twin (test_gpu_trusted_timer.py);
    that comparison means something only if each is a right GeLU: graded here, sandboxed, every check passes."""
    import json

    from grader.grading import config
    from grader.grading.commands import grade as grade_cmd
    from grader.grading.results.results import PASSED, ExerciseResult
    from tests import known_wrong

    folders = []
    for fixture in known_wrong.cheats():
        folders.append(str(known_wrong.materialize(fixture, tmp_path / fixture.name) if fixture.edits
                           else known_wrong.tree_or_fail(fixture)))
    assert len(folders) >= 7
    options = config.GradeOptions(exercises=("gelu",), random_cases=2, secret="cheats", jobs=2)
    grade_cmd.grade(folders, out=tmp_path / "out", options=options)
    for folder in folders:
        state = tmp_path / "out" / "students" / Path(folder).name / "state" / "gelu.json"
        part = ExerciseResult.from_dict(json.loads(state.read_text())).parts[0]
        failed = [c.message for c in part.checks if c.status != PASSED]
        assert part.checks and not failed and not part.flags, f"{folder}: {failed} {part.flags}"


def test_a_timer_started_ahead_waits_for_its_jobs_and_an_unused_one_is_stopped(tmp_path):
    """The exercise's timer starts with its workers and gets ready (imports, its CUDA context) while they run; it
    reads its jobs only once they are written, and a timer never given any is stopped with its folder."""
    settings = _settings(tmp_path, device="cpu")
    ahead = timer_process.Timer(settings, scratch=tmp_path / "a", arbiter=None)
    try:
        assert not ahead.process.wait(3.0)  # ready, and waiting: not ended, no result
        assert not (ahead.work / "result.json").exists()
        # the job, written now, is what it runs: here one for an exercise that does not exist
        with pytest.raises(timer_process.TimerFault, match="unknown exercise 'nope'"):
            ahead.run([timer.TimerJob("nope", "forward", 1.0, {"x": toy_plan()})])
    finally:
        ahead.close()
    unused = timer_process.Timer(settings, scratch=tmp_path / "b", arbiter=None)
    process, work = unused.process, unused.work
    unused.close()
    assert not process.alive() and not work.exists()


# A stand-in timer process: the real timer's main (its job file, its go file, its results), with its GPU steps
# replaced by lines in steps.txt beside the job ("prepared <part>", "timed <part>").
_STEPS_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); del sys.argv[1]; import pathlib, torch; "
    "from grader.speed import timer as t; steps = pathlib.Path(sys.argv[1]).with_name('steps.txt'); "
    "log = lambda line: open(steps, 'a').write(line + '\\n'); "
    "torch.cuda.get_device_name = lambda *a: 'fake GPU'; "
    "t.prepare = lambda job, folder, index=0: (log(f'prepared {job.part}'), job)[1]; "
    "t.time_prepared = lambda job, folder, index=0: (log(f'timed {job.part}'), t.TimerResult('fake GPU'))[1]; "
    "sys.exit(t.main())")


def test_a_timer_prepares_its_jobs_at_once_and_times_them_only_when_told(tmp_path, monkeypatch):
    """Handed its jobs as soon as every speed measurement is recorded, the timer loads and validates them while
    the student's other workers may still run, but starts the timed rounds only when :meth:`Timer.run` says that
    every worker has ended; a timer given other jobs than it prepared is not used for them."""
    monkeypatch.setattr(timer_process, "_BOOT", _STEPS_BOOT)
    jobs = [timer.TimerJob("rmsnorm", part, 1.0, {"x": toy_plan()}) for part in ("forward", "backward")]
    ahead = timer_process.Timer(_settings(tmp_path, device="cpu"), scratch=tmp_path / "a", arbiter=None)
    try:
        ahead.prepare(jobs)
        steps = ahead.work / "steps.txt"
        for _ in range(200):
            if steps.is_file() and steps.read_text().count("\n") == 2:
                break
            ahead.process.wait(0.05)
        assert steps.read_text().splitlines() == ["prepared forward", "prepared backward"]
        assert not ahead.process.wait(1.0) and not (ahead.work / "result.json").exists()  # waiting to be told
        assert not ahead.can_run(jobs[:1]) and ahead.can_run(jobs)
        results = ahead.run(jobs)
        assert [r.gpu for r in results] == ["fake GPU"] * 2
        assert steps.read_text().splitlines()[2:] == ["timed forward", "timed backward"]
    finally:
        ahead.close()


def test_a_crash_while_preparing_a_later_part_is_charged_to_it_and_the_earlier_parts_are_timed_anew(
        tmp_path, monkeypatch):
    """The timer prepares every part before it times the first: a crash while it loads or validates the second
    part's replays fails that part's benchmark (the kernels running were its own), and the first part, prepared
    but never timed, is timed by a new timer."""
    ok = json.dumps(timer.TimerResult("GPU", [BenchmarkTiming("a", times={}).to_dict()]).to_dict())
    boot = ("import sys, json, os, pathlib; jobs = json.loads(pathlib.Path(sys.argv[2]).read_text())['jobs']; "
            f"p = pathlib.Path(sys.argv[3]); progress = p.parent / {timer.PROGRESS!r}; "
            "progress.write_text('0 a\\n1 b\\n') if len(jobs) == 2 else p.write_text(" + repr(ok) + "); "
            "len(jobs) == 2 and os.abort()")
    monkeypatch.setattr(timer_process, "_BOOT", boot)
    parts = [timer_process.PartTiming(name, SpeedMeasurement("GPU", [BenchmarkTiming(label)],
                                                            plans={label: toy_plan()}), 1.0)
             for name, label in (("forward", "a"), ("backward", "b"))]
    timer_process.time_parts(_settings(tmp_path), "rmsnorm", parts, scratch=tmp_path)
    first, second = (entry.measurement for entry in parts)
    assert first.benchmarks[0].error is None and first.timer_fault is None
    assert second.benchmarks[0].error.startswith("the replayed kernels crashed the timer")
    assert second.benchmarks[0].label == "b"


def test_the_timer_gets_its_jobs_as_soon_as_every_speed_item_has_recorded(monkeypatch):
    """An exercise's worker groups run side by side; the timer gets every part's recording to prepare as soon as
    the last speed item has its reply (before its worker has even ended, while a correctness group still runs),
    once, in the order the merged run will list them; a speed item that answers without a recording, or whose
    group ends without its reply, does not hold the others back. Each reply then goes to the judge."""
    from types import SimpleNamespace

    from grader.grading.exercise_run import runner

    prepared: list[list[str]] = []
    monkeypatch.setattr(timer_process, "prepare_parts",
                        lambda exercise, parts, timer: prepared.append([p.part for p in parts]))
    rechecked: list[str] = []
    judge = SimpleNamespace(on_recorded=lambda item, request, reply: rechecked.append(item.id))

    def item(name, kind):
        return SimpleNamespace(id=name, kind=kind, skip_reason=None, part=SimpleNamespace(name=name), budget_s=1.0)

    def recording(it):
        return it, None, protocol.SpeedDone(it.id, SpeedMeasurement("GPU", []))

    a, b, c = item("a", "speed"), item("b", "case"), item("c", "speed")
    recorded = runner._Recorded([[a], [b], [c]], timer=object(), exercise="toy", judge=judge)
    recorded.add(*recording(c))
    assert prepared == []  # a has not recorded yet
    recorded.add(*recording(a))
    assert prepared == [["a", "c"]]  # the groups' order, whatever order they came in
    recorded.ended([a])
    recorded.ended([c])
    recorded.ended([b])
    assert prepared == [["a", "c"]] and rechecked == ["c", "a"]

    prepared.clear()
    recorded = runner._Recorded([[a], [b], [c]], timer=object(), exercise="toy", judge=judge)
    recorded.add(*recording(a))
    recorded.ended([a])
    assert prepared == []
    recorded.ended([c])  # crashed before recording: the timer gets what there is
    assert prepared == [["a"]]

    prepared.clear()
    recorded = runner._Recorded([[a], [b], [c]], timer=object(), exercise="toy", judge=judge)
    recorded.add(c, None, protocol.Raised(c.id, "ValueError: no"))  # c's worker goes on with other items
    recorded.add(*recording(a))
    assert prepared == [["a"]]

    prepared.clear()
    recorded = runner._Recorded([[a], [c]], timer=None, exercise="toy", judge=judge)  # no timer (on the CPU)
    recorded.add(*recording(a))
    recorded.add(*recording(c))
    assert prepared == []


def test_a_supervisor_hands_every_speed_reply_to_on_recorded_and_keeps_recordings_from_on_reply(tmp_path):
    """The supervisor's side of the wiring: on the judging thread, in order, a correctness reply goes to on_reply,
    a speed recording (deferred) to on_recorded only and into the run's to_time, and a speed item's failure to
    on_reply (judged as it is) and then to on_recorded."""
    from grader import exercises
    from grader.grading.exercise_run import item_plan, supervise
    from grader.grading.exercise_run.judging_thread import JudgingThread

    gelu = exercises.get("gelu")
    items = item_plan.plan(gelu, device="cuda", secret="s", random_cases=1, speed_budget_s=1.0)
    case = next(it for it in items if it.role == "example")
    speed = next(it for it in items if it.role == "speed")
    seen: list[tuple[str, str, str]] = []
    sup = supervise._Supervision(gelu, Path("."), _settings(tmp_path), scratch=tmp_path, cache_dir=None,
                                 on_reply=lambda i, q, r: seen.append(("on_reply", i.id, type(r).__name__)),
                                 arbiter=None, defer_speed=True, references=None, items=items,
                                 on_recorded=lambda i, q, r: seen.append(("on_recorded", i.id, type(r).__name__)))
    sup.judging = JudgingThread(sup.on_reply, "judge test")
    recording = protocol.SpeedDone(speed.id, SpeedMeasurement("GPU", []))
    sup._deliver(case, None, protocol.Raised(case.id, "ValueError: x"))
    sup._deliver(speed, None, recording)
    sup._deliver(speed, None, protocol.Raised(speed.id, "ValueError: y"))
    sup.judging.close()
    assert seen == [("on_reply", case.id, "Raised"), ("on_recorded", speed.id, "SpeedDone"),
                    ("on_reply", speed.id, "Raised"), ("on_recorded", speed.id, "Raised")]
    assert [entry[2] for entry in sup.result.to_time] == [recording]


@pytest.mark.parametrize("autograd_records", [True, False], ids=["both record", "autograd's worker crashes first"])
def test_an_exercise_run_prepares_its_timer_with_the_jobs_it_then_times(tmp_path, monkeypatch, autograd_records):
    """The runner's side of the wiring, through grade_exercise with the workers faked: the recordings the groups'
    supervisors report reach the timer to prepare once, before the timing, and are the very jobs it then times;
    a group that ends without its recording releases the others. The scheduler hears that the student's workers
    have ended once every group has, before the timing."""
    from types import SimpleNamespace

    from grader import exercises
    from grader.grading.exercise_run import runner, supervise
    from grader.grading.exercise_run.supervised_run import Run

    calls: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(runner, "_timer_ahead", lambda *a, **k: SimpleNamespace(close=lambda: None, cpu_s=0.0))
    monkeypatch.setattr(timer_process, "prepare_parts",
                        lambda exercise, parts, timer: calls.append(("prepare", [p.part for p in parts])))

    def time_parts(settings, exercise, parts, **kwargs):
        calls.append(("time", [p.part for p in parts]))
        return 0.0

    monkeypatch.setattr(timer_process, "time_parts", time_parts)

    def fake_run(exercise, root, group, settings, *, on_recorded, **kwargs):
        run = Run(loaded=True)
        for item in group:
            if item.role == "speed" and (autograd_records or item.part.name != "autograd"):
                reply = protocol.SpeedDone(item.id, SpeedMeasurement("GPU", []))
                run.to_time.append((item, None, reply))
                on_recorded(item, None, reply)
        calls.append(("group ended", []))
        return run

    monkeypatch.setattr(supervise, "run", fake_run)
    fa = exercises.get("flash_attention")
    timed = [p.name for p in fa.parts if p.speed_graded]
    assert len(timed) == 2
    timed = timed if autograd_records else [name for name in timed if name != "autograd"]
    settings = dataclasses.replace(_settings(tmp_path), parallel_parts=True, speed_apart=True, random_cases=1)
    runner.grade_exercise(fa, Path(__file__).parents[2] / "solutions", settings=settings, scratch=tmp_path / "s",
                          on_workers_ended=lambda: calls.append(("workers ended", [])))
    groups = [c for c in calls if c[0] == "group ended"]
    assert len(groups) > 1
    assert [c for c in calls if c[0] != "group ended"] == [("prepare", timed), ("workers ended", []), ("time", timed)]
    assert calls.index(("workers ended", [])) == len(calls) - 2, calls  # after every group, just before the timing
def test_a_replay_that_hangs_while_the_timer_prepares_is_stopped_and_charged_to_its_benchmark(tmp_path, monkeypatch):
    """Preparing happens while the student's last workers may still run, before anyone waits for the timer: its
    preparation has a limit of its own, and a timer that outlasts it (here one that hangs after announcing a
    benchmark) is stopped then, not when the workers end; the hang is charged to that benchmark."""
    boot = (f"import sys, pathlib, time; (pathlib.Path(sys.argv[3]).parent / {timer.PROGRESS!r}).write_text('0 a\\n'); "
            "time.sleep(600)")
    monkeypatch.setattr(timer_process, "_BOOT", boot)
    monkeypatch.setattr(timer_process, "SETUP_S", 1.0)
    jobs = [timer.TimerJob("gelu", "forward", 0.5, {"a": toy_plan()})]
    ahead = timer_process.Timer(_settings(tmp_path, device="cpu"), scratch=tmp_path / "a", arbiter=None)
    try:
        ahead.prepare(jobs)
        assert ahead.process.wait(20.0), "the timer hanging in its preparation was not stopped"
        [result] = ahead.run(jobs)
        assert result.benchmarks[0]["error"] == "the replayed kernels did not finish within 1.5 s while timing a"
    finally:
        ahead.close()


def test_a_benchmark_whose_call_failed_costs_its_own_credit_and_the_others_are_timed(monkeypatch):
    """An option left unwritten (matmul's GeLU epilogue raising NotImplementedError) fails its own benchmark: the
    part's other benchmarks are still timed by the trusted timer and earn their credit."""
    from grader.speed import credit
    from tests.speed.test_speed_trust import PART, _stats, _thresholds

    first, second = (b.label for b in PART.benchmarks[:2])
    unwritten = BenchmarkTiming(first, error="gelu is not implemented yet (the bf16 path)", not_implemented=True)
    recorded = SpeedMeasurement("NVIDIA H100 80GB HBM3", [unwritten, BenchmarkTiming(second, warmup_s=0.5)],
                                plans={second: toy_plan()})
    entry = timer_process.PartTiming(PART.name, recorded, 1.0)
    ((_, job),) = timer_process._jobs("gelu", [entry], complete=True)
    assert list(job.plans) == [second]  # the failed benchmark is not timed; the other is
    timed = BenchmarkTiming(second, {"student": _stats(0.094), "torch": _stats(0.0937)}, "events", "converged", 20)
    timer_process._complete(recorded, timer.TimerResult(recorded.gpu, [timed.to_dict()]))
    assert [(r.label, r.error) for r in recorded.benchmarks] == [(first, unwritten.error), (second, None)]
    verdict = credit.judge(PART, recorded, recheck=credit.Verdict(True), thresholds=_thresholds(),
                           labels=[first, second], require_calibration=False)
    assert verdict.fraction == pytest.approx(0.5, abs=0.01) and "not implemented yet" in verdict.message
