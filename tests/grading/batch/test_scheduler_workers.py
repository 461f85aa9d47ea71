"""The batch scheduler's runs with real workers on the CPU, on fake GPUs (test_scheduler.py beside it has the scheduler
with the grading replaced): a run's workers and what the student starts run at its niceness, the slot pins the
worker and the result names its GPU, a worker waiting for the GPU is not charged for it, a failed GPU's work moves,
and a slow judge never keeps the worker waiting."""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from grader.grading.batch import gpus
from tests.grading.batch.test_scheduler import FAKE, GELU

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
@pytest.mark.realtime
def test_a_worker_waiting_for_the_gpu_is_not_charged_for_it(tmp_path, monkeypatch):
    """A real worker connected to its GPU's arbiter (the items run by a CPU worker): while another process has the
    GPU alone for longer than a call may take (real seconds: the limits are the worker's and the grader's), the
    worker waits, and its items still pass — the wait moved its limits on (the grader's, and the worker's own
    watchdog's)."""
    from grader.grading import config
    from grader.grading.exercise_run import item_plan, supervise
    from grader.grading.isolation.gpu_arbiter import GpuArbiter

    monkeypatch.setattr(supervise, "GRACE_S", 1.0)
    settings = config.resolve(config.GradeOptions(random_cases=0, timeout_s=120, call_timeout_s=4.0),
                              config.load_course(), device="cpu", secret="s", workdir=tmp_path)
    items = [it for it in item_plan.plan(GELU, device="cpu", secret="s", random_cases=0, speed_budget_s=0.1)
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
@pytest.mark.realtime
def test_a_slow_judge_never_keeps_the_worker_waiting(tmp_path):
    """Replies are judged beside the worker: with every verdict taking 0.6 s, the worker gets each next request as
    soon as it replies (its idle time stays well under the judging, which it would match if it waited for each
    verdict), every reply is judged in the order the items ran, and a judge that raises still ends the run with
    the grader's fault. Real seconds: the worker is a real process."""
    from grader.grading import config
    from grader.grading.exercise_run import item_plan, supervise

    settings = config.resolve(config.GradeOptions(random_cases=5, timeout_s=120), config.load_course(),
                              device="cpu", secret="s", workdir=tmp_path)
    items = [it for it in item_plan.plan(GELU, device="cpu", secret="s", random_cases=5, speed_budget_s=0.1)
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
    assert run.profile[supervise.IDLE] < 0.5 * run.profile["judge (grader)"], run.profile

    def faulty_judge(item, request, reply):
        if item is items[1]:
            raise RuntimeError("a bug of the judge")

    with pytest.raises(RuntimeError, match="a bug of the judge"):
        supervise.run(GELU, Path(__file__).resolve().parents[3] / "solutions", items[:4], settings,
                      scratch=tmp_path / "scratch", on_reply=faulty_judge)
