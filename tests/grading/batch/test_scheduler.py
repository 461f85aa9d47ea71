"""The batch scheduler on the CPU with fake GPUs: which GPUs a batch uses and how a worker is pinned to one,
longest work first (and its workers first on the host's cores), never two timed runs on one GPU, a failing GPU
taken out of the pool with its work run elsewhere (and a failing student kernel not mistaken for one), and nothing
committed once a batch stops."""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grader import exercises
from grader.grading.batch import gpus, scheduler
from grader.grading.batch.scheduler import Scheduler, Task
from grader.grading.exercise_run.slots import Slot
from grader.grading.results.results import GRADED, ExerciseResult
from tests.gates import ThreadProcess

GELU = exercises.get("gelu")
FAKE = [gpus.Gpu(i, "Fake H100", f"GPU-fake-{i}", str(i)) for i in range(4)]


def _tasks(n: int, estimates=None) -> list[Task]:
    estimates = estimates or [1.0] * n
    return [Task(f"s{i}", GELU, SimpleNamespace(student=f"s{i}"), estimate_s=e) for i, e in enumerate(estimates)]


def _ok(task: Task, slot: Slot, **extra) -> ExerciseResult:
    return ExerciseResult(task.exercise.name, task.exercise.title, GRADED, device=dict(slot.device), **extra)


class _Log:
    """Commits and the slots they ran on."""

    def __init__(self):
        self.lock = threading.Lock()
        self.committed: list[tuple[str, ExerciseResult]] = []

    def commit(self, task: Task, result: ExerciseResult) -> None:
        with self.lock:
            self.committed.append((task.student, result))


# ------------------------------------------------------------------------------------------ the GPUs


def test_gpu_selection_current_all_and_a_list():
    assert [g.index for g in gpus.select(None, FAKE, current=2)] == [2]
    assert [g.index for g in gpus.select("all", FAKE, current=0)] == [0, 1, 2, 3]
    assert [g.index for g in gpus.select("0,2,3", FAKE, current=0)] == [0, 2, 3]
    with pytest.raises(gpus.GpuSelectionError, match="no GPU '7' here"):
        gpus.select("0,7", FAKE, current=0)
    with pytest.raises(gpus.GpuSelectionError, match="no GPU is visible"):
        gpus.select("all", [], current=0)


def test_each_gpu_slot_pins_its_worker_and_records_the_device():
    slots = gpus.gpu_slots("1,3", 2, available=FAKE, current=0)
    assert [s.name for s in slots] == ["cuda:1", "cuda:3"]
    assert [dict(s.env) for s in slots] == [{"CUDA_VISIBLE_DEVICES": "1"}, {"CUDA_VISIBLE_DEVICES": "3"}]
    assert slots[1].device == {"kind": "cuda", "name": "Fake H100", "index": 3, "uuid": "GPU-fake-3"}
    assert all(s.capacity == 2 and s.gpu_name == "Fake H100" for s in slots)
    assert slots[0].arbiter is not None and slots[0].arbiter is not slots[1].arbiter


def test_visible_gpus_honour_a_restricted_cuda_visible_devices(monkeypatch):
    """Under Slurm (or a user's own restriction) device i of this process is the i-th listed one."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa,5")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name=f"Fake {i}", uuid=f"uuid-{i}"))
    found = gpus.visible()
    assert [(g.index, g.pin, g.uuid) for g in found] == [(0, "GPU-aaa", "uuid-0"), (1, "5", "uuid-1")]


def test_longest_work_first():
    log, order = _Log(), []
    slots = [Slot("cpu-0", {"kind": "cpu"})]

    def grade(task, slot):
        order.append(task.estimate_s)
        return _ok(task, slot)

    Scheduler(slots, grade, log.commit).run(_tasks(6, [3.0, 40.0, 1.0, 160.0, 25.0, 25.0]))
    assert order == [160.0, 40.0, 25.0, 25.0, 3.0, 1.0]
    assert len(log.committed) == 6


def test_every_gpu_is_used_each_worker_is_pinned_and_never_two_timed_runs_share_a_gpu():
    slots = gpus.gpu_slots("all", 2, available=FAKE, current=0)  # two exercise runs per GPU
    log = _Log()
    busy = {s.name: [0, 0] for s in slots}  # (runs inside, timed runs inside)
    worst = {s.name: [0, 0, 0] for s in slots}  # most runs at once, most timed at once, timed beside others
    guard = threading.Lock()

    def section(slot, timed):
        with guard:
            busy[slot.name][0] += 1
            busy[slot.name][1] += timed
            runs, timed_now = busy[slot.name]
            w = worst[slot.name]
            w[0], w[1] = max(w[0], runs), max(w[1], timed_now)
            if timed_now and runs > 1:
                w[2] += 1
        time.sleep(0.01)
        with guard:
            busy[slot.name][0] -= 1
            busy[slot.name][1] -= timed

    def grade(task, slot):
        assert dict(slot.env) == {"CUDA_VISIBLE_DEVICES": str(slot.device["index"])}
        process = ThreadProcess(slot.arbiter, task.key)  # a worker on the slot's GPU
        with process.gate.use():
            for _ in range(3):  # correctness items share the GPU, the timed rounds have it alone
                section(slot, timed=False)
            with process.gate.alone():
                section(slot, timed=True)
        process.die()
        return _ok(task, slot)

    Scheduler(slots, grade, log.commit).run(_tasks(32))
    assert len(log.committed) == 32
    assert {r.device["index"] for _, r in log.committed} == {0, 1, 2, 3}
    assert all(w[1] == 1 and w[2] == 0 for w in worst.values()), worst  # a timed run is alone on its GPU
    assert max(w[0] for w in worst.values()) == 2  # correctness did share


def test_a_run_whose_workers_have_ended_gives_its_place_to_the_next_while_it_waits_for_its_timer():
    """A slot of capacity 2: at most two runs have workers at once; a run that says its workers have ended (it only
    waits for its trusted timer and its credit) lets the next run start, up to four runs at once in all; a run
    that never says so holds its place to its end."""
    slots = [Slot("cpu-0", {"kind": "cpu"}, capacity=2)]
    lock, log = threading.Lock(), _Log()
    with_workers, tails, worst = set(), set(), [0, 0]  # most with workers at once, most runs at once
    first_tail_started = threading.Event()

    def grade(task, slot):
        with lock:
            with_workers.add(task.student)
            worst[0] = max(worst[0], len(with_workers))
            worst[1] = max(worst[1], len(with_workers | tails))
        time.sleep(0.05)  # its workers
        with lock:
            with_workers.discard(task.student)
            if task.student != "s0":  # s0 never says so: its place is its own until it ends
                tails.add(task.student)
        if task.student != "s0":
            task.workers_ended()
            task.workers_ended()  # a second call gives nothing back twice
        first_tail_started.set()
        time.sleep(0.3)  # waiting for its timer
        with lock:
            tails.discard(task.student)
        return _ok(task, slot)

    started = time.monotonic()
    Scheduler(slots, grade, log.commit).run(_tasks(8))
    elapsed = time.monotonic() - started
    assert len(log.committed) == 8
    assert worst == [2, 4]  # never more than the capacity with workers; the tails overlapped them
    assert elapsed < 8 * 0.35 / 2 - 0.2, elapsed  # the tails overlapped the next runs' workers


def test_a_gpu_that_fails_is_taken_out_and_its_work_runs_elsewhere():
    slots = gpus.gpu_slots("all", 1, available=FAKE[:3], current=0)
    log, failures, ran_on = _Log(), [], []
    dead = {"cuda:1"}

    def grade(task, slot):
        ran_on.append((task.student, slot.name))
        if slot.name in dead:
            return _ok(task, slot, problems=["crashed with SIGSEGV while running the forward example case"])
        time.sleep(0.01)
        return _ok(task, slot)

    def probe(slot):
        return "CUDA is not available (torch.cuda.is_available() is False)" if slot.name in dead else None

    sched = Scheduler(slots, grade, log.commit, probe=probe, on_failure=failures.append)
    outcome = sched.run(_tasks(9))
    assert len(log.committed) == 9 and not outcome.left
    assert [f.slot for f in failures] == ["cuda:1"] and slots[1].failed
    assert sum(1 for _, s in ran_on if s == "cuda:1") == 1  # no work goes to it afterwards
    moved = [r for _, r in log.committed if r.device.get("replaces")]
    assert len(moved) == 1 and moved[0].device["index"] != 1
    assert "cuda:1 (Fake H100, GPU-fake-1): CUDA is not available" in moved[0].device["replaces"][0]
    assert all(not r.problems for _, r in log.committed)


def test_a_failing_student_kernel_does_not_take_the_gpu_out():
    slots = gpus.gpu_slots("0", 1, available=FAKE, current=0)
    log, probed = _Log(), []

    def grade(task, slot):
        return _ok(task, slot, problems=["CUDA error: an illegal memory access was encountered"])

    outcome = Scheduler(slots, grade, log.commit, probe=lambda s: probed.append(s.name)).run(_tasks(2))
    assert probed == ["cuda:0", "cuda:0"] and not outcome.failures and slots[0].failed is None
    assert [r.problems for _, r in log.committed] == [["CUDA error: an illegal memory access was encountered"]] * 2


def test_when_every_gpu_fails_the_rest_is_left_ungraded():
    slots = gpus.gpu_slots("0,1", 1, available=FAKE, current=0)
    log = _Log()
    outcome = Scheduler(slots, lambda t, s: _ok(t, s, problems=["lost"]), log.commit,
                        probe=lambda s: "health check failed: no device").run(_tasks(5))
    assert log.committed == [] and len(outcome.left) == 5 and len(outcome.failures) == 2


def test_a_task_whose_gpus_keep_failing_needs_a_regrade():
    slots = gpus.gpu_slots("all", 1, available=FAKE, current=0)
    log = _Log()
    outcome = Scheduler(slots, lambda t, s: _ok(t, s, problems=["lost"]), log.commit,
                        probe=lambda s: "health check failed", max_failovers=2).run(_tasks(1))
    ((_, result),) = log.committed
    assert result.status == "needs regrade" and len(result.device["replaces"]) == 3
    assert "the GPU failed under this exercise 3 time(s)" in result.grader_errors[0].error
    assert len(outcome.failures) == 3 and slots[3].failed is None


def test_nothing_is_committed_once_the_batch_stops():
    log = _Log()
    started = threading.Event()

    def grade(task, slot):
        started.set()
        time.sleep(0.3)
        return _ok(task, slot)

    sched = Scheduler([Slot("cpu-0", {"kind": "cpu"})], grade, log.commit)
    runner = threading.Thread(target=sched.run, args=(_tasks(3),))
    runner.start()
    started.wait(5)
    sched.stop()
    runner.join(5)
    assert log.committed == []


def test_estimates_from_the_spec_and_from_history():
    fa = exercises.get("flash_attention")
    cpu = dict(device="cpu", random_cases=5, speed_budget_s=10.0)
    cuda = dict(device="cuda", random_cases=5, speed_budget_s=10.0)
    assert scheduler.static_estimate(fa, **cuda) > scheduler.static_estimate(GELU, **cuda)
    assert scheduler.static_estimate(GELU, **cuda) > scheduler.static_estimate(GELU, **cpu)  # timing on top
    previous = ExerciseResult("gelu", "GeLU", GRADED, elapsed_s=42.0)
    assert scheduler.estimate(GELU, previous, {"gelu": [5.0]}, 1.0) == 42.0
    assert scheduler.estimate(GELU, None, {"gelu": [5.0, 7.0, 30.0]}, 1.0) == 7.0
    assert scheduler.estimate(GELU, None, {}, 1.0) == 1.0


def test_the_longest_work_runs_at_niceness_0_and_shorter_work_nicer_in_proportion():
    assert scheduler.niceness(190.0, 190.0) == 0
    assert scheduler.niceness(250.0, 190.0) == 0  # an estimate above the batch's longest: still the critical path
    assert scheduler.niceness(5.0, 0.0) == 0  # nothing known about the batch: nothing changed
    niceness = [scheduler.niceness(e, 190.0) for e in (190.0, 113.0, 71.0, 61.0, 0.0)]
    assert niceness == sorted(niceness) and niceness[0] == 0 < niceness[1]
    assert niceness[-1] == scheduler.NICE_SPAN


def test_a_batch_gives_each_run_the_niceness_of_its_estimate(tmp_path, monkeypatch):
    """Through ``grade()``: every FlashAttention run (the longest estimate) has niceness 0, every GeLU run more."""
    from grader.grading import config
    from grader.grading.batch import pipeline
    from grader.grading.commands import grade as grade_cmd
    from tests.sandboxing import sandbox_options

    seen: dict[str, set[int]] = {}

    def fake_grade(exercise, root, *, settings, **_):
        seen.setdefault(exercise.name, set()).add(settings.nice)
        return ExerciseResult(exercise.name, exercise.title, GRADED)

    monkeypatch.setattr(pipeline.runner, "grade_exercise", fake_grade)
    for student in ("a", "b"):
        (tmp_path / student).mkdir()
    options = config.GradeOptions(exercises=("gelu", "flash_attention"), jobs=2, secret="s", **sandbox_options())
    grade_cmd.grade([str(tmp_path / "a"), str(tmp_path / "b")], out=tmp_path / "out", options=options)
    fa, gelu = exercises.get("flash_attention"), GELU
    static = [scheduler.static_estimate(e, device="cpu", random_cases=5, speed_budget_s=10.0) for e in (fa, gelu)]
    assert seen == {"flash_attention": {0}, "gelu": {scheduler.niceness(static[1], static[0])}}
    assert scheduler.niceness(static[1], static[0]) > 0


# ------------------------------------------------------------------------------------------ with workers

PRINT_NICE = '''
import os
print("NICE", os.nice(0), flush=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize("nice", [0, 6])
def test_a_runs_workers_and_what_the_student_starts_run_at_its_niceness(tmp_path, nice):
    from grader.grading import config
    from grader.grading.exercise_run import runner

    (tmp_path / "sub" / "gelu").mkdir(parents=True)
    (tmp_path / "sub" / "gelu" / "gelu.py").write_text(PRINT_NICE)
    settings = config.resolve(config.GradeOptions(random_cases=0, timeout_s=60), config.load_course(),
                              device="cpu", secret="s", workdir=tmp_path)
    result = runner.grade_exercise(GELU, tmp_path / "sub", settings=replace(settings, nice=nice),
                                   scratch=tmp_path / "scratch")
    assert f"NICE {os.nice(0) + nice}" in result.log

PRINT_PIN = '''
import os
print("PIN", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
from solutions_gelu import gelu  # noqa: F401  (not importable: the worker sees only the grader package)
'''


@pytest.mark.slow
def test_the_slot_pins_the_worker_and_the_result_names_its_gpu(tmp_path):
    from grader.grading import config
    from grader.grading.exercise_run import runner

    (tmp_path / "sub" / "gelu").mkdir(parents=True)
    (tmp_path / "sub" / "gelu" / "gelu.py").write_text(PRINT_PIN)
    settings = config.resolve(config.GradeOptions(random_cases=0, timeout_s=60), config.load_course(),
                              device="cpu", secret="s", workdir=tmp_path)
    slot = gpus.gpu_slots("2", 1, available=FAKE, current=0)[0]
    result = runner.grade_exercise(GELU, tmp_path / "sub", settings=settings, scratch=tmp_path / "scratch", slot=slot)
    assert "PIN 2" in result.log
    assert result.device == {"kind": "cuda", "name": "Fake H100", "index": 2, "uuid": "GPU-fake-2"}


@pytest.mark.slow
def test_a_worker_waiting_for_the_gpu_is_not_charged_for_it(tmp_path, monkeypatch):
    """A real worker connected to its GPU's arbiter (the items run by a CPU worker): while another process has the
    GPU alone for longer than a call may take, the worker waits, and its items still pass — the wait moved its
    limits on (the grader's, and the worker's own watchdog's)."""
    from grader.grading import config
    from grader.grading.exercise_run import plan, supervise
    from grader.grading.isolation.gpu_arbiter import GpuArbiter

    monkeypatch.setattr(supervise, "GRACE_S", 1.0)
    settings = config.resolve(config.GradeOptions(random_cases=0, timeout_s=120, call_timeout_s=4.0),
                              config.load_course(), device="cpu", secret="s", workdir=tmp_path)
    items = [it for it in plan.plan(GELU, device="cpu", secret="s", random_cases=0, speed_budget_s=0.1)
             if it.role == "example"][:2]
    arbiter = GpuArbiter()
    (tmp_path / "scratch").mkdir()
    with arbiter.alone():  # the worker starts paused
        result: list = []
        t = threading.Thread(target=lambda: result.append(supervise.run(
            GELU, Path(__file__).resolve().parents[3] / "solutions", items, settings, scratch=tmp_path / "scratch",
            arbiter=arbiter)))
        t.start()
        time.sleep(settings.call_timeout_s + supervise.GRACE_S + 2)
    t.join(60)
    (run,) = result
    assert set(run.replies) == {it.id for it in items} and not run.failed, (run.failed, run.problems)


@pytest.mark.slow
def test_a_batch_on_fake_gpus_moves_the_work_of_a_failed_gpu_and_says_so(tmp_path, monkeypatch):
    """The whole batch (grade() → scheduler → workers → reports) with two fake GPUs on the CPU: the first
    health check after a crash fails, so that GPU leaves the pool and the crashed task runs on the other."""
    from grader.grading import config
    from grader.grading.batch import pipeline as batch_mod
    from grader.grading.commands import grade as grade_cmd
    from grader.grading.results import store

    repo = Path(__file__).resolve().parents[3]
    shutil.copytree(repo / "solutions", tmp_path / "alice")
    (tmp_path / "sam" / "gelu").mkdir(parents=True)
    (tmp_path / "sam" / "gelu" / "gelu.py").write_text("import ctypes\nctypes.string_at(0)\n")  # crashes at import
    monkeypatch.setattr(batch_mod, "local_slots", lambda ctx, options: gpus.gpu_slots("all", 1, available=FAKE[:2],
                                                                                        current=0))
    probes = []

    def probe(slot):
        probes.append(slot.name)
        return "health check failed: CUDA is not available" if len(probes) == 1 else None

    monkeypatch.setattr(gpus, "probe_slot", probe)
    out = tmp_path / "out"
    batch = grade_cmd.grade([str(tmp_path / n) for n in ("alice", "sam")], out=out,
                            options=config.GradeOptions(exercises=("gelu",), random_cases=0, secret="s"))
    assert batch.left == 0 and len(probes) == 2 and probes[0] != probes[1]
    (failure,) = store.gpu_failures(out)
    assert failure["slot"] == probes[0] and failure["task"] == "sam gelu"
    results = {s: store.load_exercises(out, s)["gelu"] for s in ("alice", "sam")}
    assert all(r.device["kind"] == "cuda" and r.device["name"] == "Fake H100" for r in results.values())
    sam = results["sam"]
    assert f"cuda:{sam.device['index']}" == probes[1] and "crashed with SIGSEGV" in sam.problems[0]
    assert sam.device["replaces"] == [f"{probes[0]} (Fake H100, GPU-fake-{probes[0][-1]}): {failure['reason']}"]
    report = (out / "students" / "sam" / "report.md").read_text()
    assert f"on GPU {sam.device['index']} (Fake H100, GPU-fake-{sam.device['index']}), graded again there" in report
    assert "GPUs taken out of the pool" in (out / store.CLASS_REPORT_HTML).read_text()


@pytest.mark.slow
def test_a_slow_judge_never_keeps_the_worker_waiting(tmp_path):
    """Replies are judged beside the worker: with every verdict taking 0.6 s, the worker gets each next request as
    soon as it replies (its idle time stays a small fraction of the judging), every reply is judged in the order
    the items ran, and a judge that raises still ends the run with the grader's fault."""
    from grader.grading import config
    from grader.grading.exercise_run import plan, supervise

    settings = config.resolve(config.GradeOptions(random_cases=5, timeout_s=120), config.load_course(),
                              device="cpu", secret="s", workdir=tmp_path)
    items = [it for it in plan.plan(GELU, device="cpu", secret="s", random_cases=5, speed_budget_s=0.1)
             if it.role in ("example", "random")][:8]
    (tmp_path / "scratch").mkdir()
    judged: list[str] = []

    def slow_judge(item, request, reply):
        time.sleep(0.6)
        judged.append(item.id)

    run = supervise.run(GELU, Path(__file__).resolve().parents[3] / "solutions", items, settings,
                        scratch=tmp_path / "scratch", on_reply=slow_judge)
    assert judged == [it.id for it in items] and set(run.replies) == set(judged), (run.failed, run.problems)
    assert run.profile["judge (grader)"] >= 0.6 * len(items)
    assert run.profile[supervise.IDLE] < 0.1 * run.profile["judge (grader)"], run.profile

    def faulty_judge(item, request, reply):
        if item is items[1]:
            raise RuntimeError("a bug of the judge")

    with pytest.raises(RuntimeError, match="a bug of the judge"):
        supervise.run(GELU, Path(__file__).resolve().parents[3] / "solutions", items[:4], settings,
                      scratch=tmp_path / "scratch", on_reply=faulty_judge)
