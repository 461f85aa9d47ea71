"""What a worker and a trusted timer import: never hypothesis. They import the exercises (references, inputs,
checks) but never draw a case (the grader does), and every such process of a batch would pay for the import."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys
from grader import exercises
exercises.all_exercises()  # what a worker and a trusted timer import
import grader.grading.isolation.worker, grader.checks.execute, grader.checks.compile_ahead, grader.speed.autotune
import grader.speed.measure, grader.speed.recorder, grader.speed.timer, grader.speed.trusted
before = "hypothesis" in sys.modules
if sys.argv[1] == "draw":
    from grader.checks import cases
    cases.draw(exercises.get("gelu").parts[0], "cpu", 1, 0)
print(json.dumps([before, "hypothesis" in sys.modules]))
"""


def _imported(mode: str) -> list[bool]:
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_workers_and_timers_never_import_hypothesis_and_drawing_a_case_does():
    assert _imported("import") == [False, False]
    assert _imported("draw") == [False, True]  # the probe sees the import where it happens
