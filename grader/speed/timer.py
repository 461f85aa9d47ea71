"""The trusted timer process: ``python -m grader.speed.timer JOB.json RESULT.json``.

The grader starts one per student's speed-graded part, in a sandbox that shows it the grader package and
a scratch folder only, never the submission: it could not import the student's module if it tried, and it
imports nothing that does (a test holds it so). It reads a :class:`TimerJob` (the part, the timing budget
and the :class:`~grader.speed.plan.LaunchPlan` the student's worker recorded for each benchmark), times
every plan with :func:`grader.speed.trusted.time_plan` in a CUDA context of its own, and writes a
:class:`TimerResult`. It holds no secret and nothing of another student: whatever a replayed kernel does
to its GPU memory ends with the process.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.speed.plan import LaunchPlan, PlanError

PROGRESS = "progress.txt"  # beside the result: the label of each benchmark as its replay starts


@dataclass
class TimerJob:
    exercise: str
    part: str
    budget_s: float
    plans: dict[str, LaunchPlan]  # benchmark label -> plan; benchmarks without one are not timed
    baselines: list[str] | None = None  # default: the grading baselines

    def to_dict(self) -> dict[str, Any]:
        return {"exercise": self.exercise, "part": self.part, "budget_s": self.budget_s,
                "plans": {label: plan.to_dict() for label, plan in self.plans.items()}, "baselines": self.baselines}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimerJob:
        return cls(str(data["exercise"]), str(data["part"]), float(data["budget_s"]),
                   {str(k): LaunchPlan.from_dict(v) for k, v in data["plans"].items()}, data.get("baselines"))


@dataclass
class TimerResult:
    gpu: str
    benchmarks: list[dict[str, Any]] = field(default_factory=list)  # BenchmarkTiming.to_dict() per plan
    mismatches: list[str] = field(default_factory=list)  # "<label>: why the replay is not the function"
    error: str | None = None  # the timer itself failed (a grader fault)

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "benchmarks": self.benchmarks, "mismatches": self.mismatches, "error": self.error}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimerResult:
        return cls(str(data["gpu"]), list(data["benchmarks"]), [str(m) for m in data["mismatches"]],
                   data.get("error"))


def run(job: TimerJob, folder: Path) -> TimerResult:
    """Time every plan of ``job`` (see the module docstring), working in ``folder``; the label of each
    benchmark is appended to ``folder/PROGRESS`` before its kernels are loaded, so that whoever started the
    timer knows which benchmark a crash or a hang belongs to."""
    import torch

    from grader import exercises
    from grader.speed import trusted

    part = exercises.get(job.exercise).part(job.part)
    result = TimerResult(torch.cuda.get_device_name())
    planned = [b for b in part.benchmarks if b.label in job.plans]
    per_benchmark = job.budget_s / max(1, len(planned))
    for i, bench in enumerate(planned):
        with open(folder / PROGRESS, "a") as progress:
            progress.write(bench.label.replace(" ", "_") + "\n")
        timed = trusted.time_plan(part, bench, job.plans[bench.label], folder=folder / "replay" / f"b{i}",
                                  budget_s=per_benchmark, baselines=job.baselines)
        result.benchmarks.append(timed.row.to_dict())
        if timed.mismatch:
            result.mismatches.append(f"{bench.label}: {timed.mismatch}")
        if timed.row.error:
            break
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m grader.speed.timer JOB.json RESULT.json", file=sys.stderr)
        return 2
    job_path, result_path = Path(args[0]), Path(args[1])
    from grader.checks import runtime

    runtime.configure()
    try:
        job = TimerJob.from_dict(json.loads(job_path.read_text()))
    except (PlanError, KeyError, TypeError, ValueError) as exc:
        result = TimerResult("", error=f"the timer's job is malformed: {type(exc).__name__}: {exc}")
    else:
        result = run(job, result_path.parent)
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict()))
    tmp.replace(result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
