"""The batch scheduler on the CPU with fake GPUs: which GPUs a batch uses and how a worker is pinned to one,
longest work first (and its workers first on the host's cores), never two timed runs on one GPU, a failing GPU
taken out of the pool with its work run elsewhere (and a failing student kernel not mistaken for one), and nothing
committed once a batch stops."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from grader import exercises
from grader.grading.batch import gpus, scheduler
from grader.grading.batch.scheduler import Scheduler, Task
from grader.grading.exercise_run.slots import Slot
from grader.grading.isolation.gpu_arbiter import GpuArbiter
from grader.grading.results.results import GRADED, ExerciseResult
from tests.gates import HANG_S, ThreadProcess, asked_turns, until, waiting_in
from tests.manual_clock import ManualClock

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
    """The first two runs of each GPU (all eight places at once) meet inside a correctness item. Then the first of
    each two takes its turn alone while the second is inside an item, which ends once the turn waits for it to pause
    (or, had the turn been granted regardless, once the timed rounds have begun); the timed rounds go on until the
    second's turn is queued (or, had it been granted beside them, has begun). Later runs just run."""
    clock = ManualClock()
    slots = gpus.gpu_slots("all", 2, available=FAKE, current=0)  # two exercise runs per GPU
    for slot in slots:
        slot.arbiter = GpuArbiter(clock=clock)  # a turn waiting for a process to pause is seen on the clock
    log = _Log()
    busy = {s.name: [0, 0] for s in slots}  # (runs inside, timed runs inside)
    worst = {s.name: [0, 0, 0] for s in slots}  # most runs at once, most timed at once, timed beside others
    guard = threading.Lock()
    first_runs = threading.Barrier(8, timeout=HANG_S)
    started: list[tuple[str, str]] = []  # (run, GPU), in the order the runs started
    timed: dict[str, threading.Event] = {}  # set once a run's timed rounds have begun

    def section(slot, timed_rounds: threading.Event | None = None, meet=None):
        with guard:
            busy[slot.name][0] += 1
            busy[slot.name][1] += timed_rounds is not None
            runs, timed_now = busy[slot.name]
            w = worst[slot.name]
            w[0], w[1] = max(w[0], runs), max(w[1], timed_now)
            if timed_now and runs > 1:
                w[2] += 1
        if timed_rounds is not None:
            timed_rounds.set()
        if meet is not None:
            meet()
        with guard:
            busy[slot.name][0] -= 1
            busy[slot.name][1] -= timed_rounds is not None

    def first_two(key: str, slot) -> list[str]:
        """The first two runs on ``slot``, in the order they started, if ``key`` is one of them."""
        two = [k for k, s in started[:8] if s == slot.name]
        return two if key in two else []

    def grade(task, slot):
        assert dict(slot.env) == {"CUDA_VISIBLE_DEVICES": str(slot.device["index"])}
        key, timed[task.key] = task.key, threading.Event()
        with guard:
            started.append((key, slot.name))
            first = len(started) <= 8
        process = ThreadProcess(slot.arbiter, key)  # a worker on the slot's GPU
        with process.gate.use():  # correctness items share the GPU, the timed rounds have it alone
            section(slot, meet=first_runs.wait if first else None)
            two = first_two(key, slot)
            section(slot)
            if two[1:] == [key]:
                section(slot, meet=lambda: until(
                    lambda: clock.deadline_of(process.client.drained) is not None or timed[two[0]].is_set(),
                    "the other run's turn waits for this item"))
            else:
                section(slot)
            with process.gate.alone():
                if two[:1] == [key]:
                    section(slot, timed[key], meet=lambda: until(
                        lambda: asked_turns(slot.arbiter) > 0 or timed[two[1]].is_set(),
                        "the other run asks for its turn"))
                else:
                    section(slot, timed[key])
        process.die()
        return _ok(task, slot)

    Scheduler(slots, grade, log.commit).run(_tasks(32))
    assert len(log.committed) == 32
    assert {r.device["index"] for _, r in log.committed} == {0, 1, 2, 3}
    assert all(w[1] == 1 and w[2] == 0 for w in worst.values()), worst  # a timed run is alone on its GPU
    assert all(w[0] == 2 for w in worst.values()), worst  # correctness did share


def test_a_run_whose_workers_have_ended_gives_its_place_to_the_next_while_it_waits_for_its_timer():
    """A slot of capacity 2: at most two runs have workers at once; a run that says its workers have ended (it only
    waits for its trusted timer and its credit) lets the next run start, up to four runs at once in all; a run
    that never says so holds its place to its end."""
    slots = [Slot("cpu-0", {"kind": "cpu"}, capacity=2)]
    lock, log = threading.Lock(), _Log()
    started, with_workers, running = [], set(), set()
    worst = [0, 0]  # most with workers at once, most runs at once
    workers_end = {f"s{i}": threading.Event() for i in range(8)}  # the test ends each run's steps
    timer_ends = {f"s{i}": threading.Event() for i in range(8)}
    holding: list[threading.Event] = []  # the steps runs are inside, waiting for the test to end them

    def step(ends: threading.Event) -> None:
        with lock:
            holding.append(ends)
        ends.wait(HANG_S)
        with lock:
            holding.remove(ends)

    def grade(task, slot):
        with lock:
            started.append(task.student)
            running.add(task.student)
            with_workers.add(task.student)
            worst[0], worst[1] = max(worst[0], len(with_workers)), max(worst[1], len(running))
        step(workers_end[task.student])
        with lock:
            with_workers.discard(task.student)
        if task.student != "s0":  # s0 never says so: its place is its own until it ends
            task.workers_ended()
            task.workers_ended()  # a second call gives nothing back twice
        step(timer_ends[task.student])
        with lock:
            running.discard(task.student)
        return _ok(task, slot)

    sched = Scheduler(slots, grade, log.commit)
    runner = threading.Thread(target=sched.run, args=(_tasks(8),))
    runner.start()
    threads = scheduler.TAIL_RUNS_PER_PLACE * slots[0].capacity

    def settled() -> list[str]:
        """The runs started so far, once each of the slot's threads waits: inside a run, for the test to end a
        step, or for a task it may start."""

        def still() -> bool:
            with lock:
                waiting = len(holding) == len(running) and not any(ends.is_set() for ends in holding)
                return waiting and waiting_in(sched._cond) == threads - len(running)

        until(still, "the scheduler settles")
        return list(started)

    assert settled() == ["s0", "s1"]  # two places
    workers_end["s1"].set()
    assert settled() == ["s0", "s1", "s2"]  # s1 waits for its timer: s2 takes its place
    workers_end["s2"].set()
    assert settled() == ["s0", "s1", "s2", "s3"]
    workers_end["s3"].set()
    workers_end["s0"].set()
    assert settled() == ["s0", "s1", "s2", "s3"]  # a place is free (s3's), a thread is not
    timer_ends["s1"].set()
    assert settled() == ["s0", "s1", "s2", "s3", "s4"]
    timer_ends["s2"].set()
    assert settled() == ["s0", "s1", "s2", "s3", "s4"]  # a thread is free; s0 holds its place to its end
    timer_ends["s0"].set()
    assert settled() == ["s0", "s1", "s2", "s3", "s4", "s5"]
    for ends in (*workers_end.values(), *timer_ends.values()):
        ends.set()
    runner.join(HANG_S)
    assert len(log.committed) == 8
    assert worst == [2, 4]  # never more than the capacity with workers; the tails overlapped them


def test_a_gpu_that_fails_is_taken_out_and_its_work_runs_elsewhere():
    slots = gpus.gpu_slots("all", 1, available=FAKE[:3], current=0)
    log, failures, ran_on = _Log(), [], []
    dead = {"cuda:1"}
    first_runs = threading.Barrier(3, timeout=HANG_S)  # one run on each GPU: the failing one gets work

    def grade(task, slot):
        with log.lock:
            ran_on.append((task.student, slot.name))
            first = len(ran_on) <= 3
        if first:
            first_runs.wait()
        if slot.name in dead:
            return _ok(task, slot, problems=["crashed with SIGSEGV while running the forward example case"])
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
    started, stopped = threading.Event(), threading.Event()

    def grade(task, slot):
        started.set()
        stopped.wait(HANG_S)  # still grading when the batch stops
        return _ok(task, slot)

    sched = Scheduler([Slot("cpu-0", {"kind": "cpu"})], grade, log.commit)
    runner = threading.Thread(target=sched.run, args=(_tasks(3),))
    runner.start()
    assert started.wait(HANG_S)
    sched.stop()
    stopped.set()
    runner.join(HANG_S)
    assert not runner.is_alive() and log.committed == []


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
