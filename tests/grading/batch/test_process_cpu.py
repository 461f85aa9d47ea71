"""``--profile``'s CPU of the workers and trusted timers: read from Linux's /proc while they run, per process tree
(the sandbox, the command, the compilers it waited for), and charged to the step of the exercise run that spent it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from grader.grading import config
from grader.grading.batch import profiling
from grader.grading.batch.result_commits import cpu_text
from grader.grading.commands import grade as grade_cmd
from grader.grading.exercise_run import supervise
from grader.grading.isolation import processes, proctree
from tests.gates import until

from ...sandboxing import sandbox_options

REPO = Path(__file__).parents[3]

# Burns 0.4 s of CPU in a child it waits for, then 0.4 s itself, then waits to be stopped.
_TREE = """
import subprocess, sys, time
burn = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass\\n"
subprocess.run([sys.executable, "-c", burn], check=True)
exec(burn)
print("burnt", flush=True)
time.sleep(60)
"""


def test_a_process_trees_cpu_counts_itself_and_the_children_it_waited_for(tmp_path):
    process = processes.Process([sys.executable, "-c", _TREE], cwd=str(tmp_path), env={}, rss_limit_bytes=None,
                                output_cap=1 << 16)
    try:
        until(lambda: "burnt" in process.readers[0].captured().text(), "the tree burnt its CPU", 30, look_s=0.05)
    finally:
        process.stop()
    # read as it was stopped (its last figure, not nothing): 0.4 s its own, 0.4 s its child's, Python's start-ups
    assert 0.75 <= process.cpu_s() < 3.0, process.cpu_s()


def test_a_process_that_ends_by_itself_is_read_as_it_exits(tmp_path):
    """Read from its zombie before it is reaped: all of its CPU, and its child's (a timer that exits when done)."""
    process = processes.Process([sys.executable, "-c", _TREE.replace("time.sleep(60)", "")], cwd=str(tmp_path),
                                env={}, rss_limit_bytes=None, output_cap=1 << 16)
    assert process.wait(30)
    assert 0.75 <= process.cpu_s() < 3.0, process.cpu_s()
    assert not process.alive() and process.stop().returncode == 0


def test_cpu_seconds_reads_user_and_system_time_of_the_process():
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    import os

    assert proctree.cpu_seconds([os.getpid()]) >= 0.3
    assert proctree.cpu_seconds([2 ** 22 + 7]) == 0.0  # no such process: nothing, not an error


def test_a_runs_cpu_is_charged_to_the_step_that_spent_it(tmp_path, capsys):
    """A module that burns a second of CPU when imported: the run's "import the module" step has it, the steps
    after it do not (each step is charged from the end of the one before), and the batch's line adds it up."""
    submission = tmp_path / "burns"
    shutil.copytree(REPO / "solutions" / "gelu", submission / "gelu")
    module = submission / "gelu" / "gelu.py"
    module.write_text(module.read_text().replace(
        "import torch\n", "import torch\n\n_end = time.process_time() + 1.0\nwhile time.process_time() < _end:\n"
        "    pass\n", 1).replace("import torch\n", "import time\n\nimport torch\n", 1))
    options = config.GradeOptions(exercises=("gelu",), jobs=1, timeout_s=120.0, call_timeout_s=10.0, random_cases=0,
                                  secret="test-secret", profile=True, **sandbox_options())
    grade_cmd.grade([str(submission)], out=tmp_path / "out", options=options)
    state = json.loads((tmp_path / "out" / "students" / "burns" / "state" / "gelu.json").read_text())
    cpu = state["cpu"]
    assert state["status"] == "graded"
    assert 0.95 <= cpu["import the module"] < 3.0, cpu
    assert cpu["worker start"] > 0.3, cpu  # the sandbox and Python with torch and triton
    assert cpu["examples"] < 0.9, cpu  # not the import's second again
    err = capsys.readouterr().err
    assert "CPU of its processes: " in err
    line = next(x for x in err.splitlines() if "the workers' and trusted timers' CPU" in x)
    assert "import the module 1." in line or "import the module 2." in line, line


def test_the_batchs_cpu_line_sorts_the_steps_and_gives_them_per_submission():
    text = profiling.processes_cpu_text({"worker start": 4.0, "examples": 10.0, supervise.CUT_SHORT: 0.5}, 2)
    assert text.startswith("  the workers' and trusted timers' CPU 14.5 s (7.2 s per submission): examples 10.0 s")
    assert text.index("examples") < text.index("worker start") < text.index(supervise.CUT_SHORT)
    assert cpu_text({"a": 1.0, "b": 2.0}) == "3.0 s: b 2.0 s, a 1.0 s"
    assert "\n" not in text  # no wall time given: no second line


def test_the_batchs_cpu_line_gives_the_wall_time_per_second_of_it():
    text = profiling.processes_cpu_text({"worker start": 4.0, "examples": 16.0}, 2, wall=5.0)
    first, second = text.split("\n")
    assert first.startswith("  the workers' and trusted timers' CPU 20.0 s")
    assert second == "  the batch's wall time per second of that CPU: 0.250 s"


def test_the_cpu_of_a_request_that_ends_its_worker_is_counted(tmp_path):
    """A call that burns 2.5 s and then ends the worker (as a crash or the worker's own watchdog does): charged as
    the request cut short, as last read (the memory watch reads it at least once a second). One example's call
    does it; the others pass."""
    submission = tmp_path / "dies"
    shutil.copytree(REPO / "solutions" / "gelu", submission / "gelu")
    module = submission / "gelu" / "gelu.py"
    module.write_text(module.read_text().replace(
        "def gelu(x: torch.Tensor) -> torch.Tensor:\n",
        "def gelu(x: torch.Tensor) -> torch.Tensor:\n    import os, time\n"
        "    if x.numel() == 1021:  # one example's call (the others pass)\n"
        "        end = time.process_time() + 2.5\n"
        "        while time.process_time() < end:\n            pass\n        os._exit(3)\n", 1))
    options = config.GradeOptions(exercises=("gelu",), jobs=1, timeout_s=120.0, call_timeout_s=10.0, random_cases=0,
                                  secret="test-secret", **sandbox_options())
    grade_cmd.grade([str(submission)], out=tmp_path / "out", options=options)
    state = json.loads((tmp_path / "out" / "students" / "dies" / "state" / "gelu.json").read_text())
    assert state["cpu"][supervise.CUT_SHORT] >= 1.2, state["cpu"]


def test_the_trusted_timer_says_its_cpu_as_it_ends(tmp_path):
    """Its sandbox's exit hides a timer's CPU from the grader, so the timer writes it beside its result."""
    from grader.speed import timer

    jobs, result = tmp_path / "jobs.json", tmp_path / "result.json"
    jobs.write_text("{not json")
    done = subprocess.run([sys.executable, "-m", "grader.speed.timer", str(jobs), str(result)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "malformed" in json.loads(result.read_text())["error"]
    assert 0.1 < float((tmp_path / timer.CPU).read_text()) < 30  # its imports at least


def test_a_sandbox_that_ends_by_itself_is_read_while_it_runs(tmp_path):
    """bwrap does not wait for the processes inside its sandbox, so its exit says nothing of their CPU: a sandboxed
    process is read while it runs, once a second even without a memory limit (a trusted timer)."""
    from ...sandboxing import require_sandbox

    box = require_sandbox()
    burn = "import time\nend = time.process_time() + 2.5\nwhile time.process_time() < end:\n    pass\n"
    argv = box.command([sys.executable, "-c", burn], binds=[], env={}, cwd="/")
    process = processes.Process(argv, cwd=str(tmp_path), env={}, rss_limit_bytes=None, output_cap=1 << 16,
                                pid_namespace=True)
    assert process.wait(60)
    outcome = process.stop()
    assert outcome.returncode == 0, outcome.stderr.text()
    assert process.cpu_s() >= 1.2, process.cpu_s()
