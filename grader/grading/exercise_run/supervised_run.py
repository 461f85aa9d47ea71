"""What the workers did with an exercise's plan (:func:`grader.grading.exercise_run.supervise.run`): a reply per
item, or why there is none, with the run's notes, logs and profile; the runs of one exercise's parts merged into one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grader.grading.exercise_run.item_plan import Item
from grader.grading.isolation import protocol


@dataclass
class Run:
    """What the workers did with a plan: a reply per item, or why there is none."""

    replies: dict[str, protocol.ItemReply] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # item id -> why it has no reply
    not_run: dict[str, str] = field(default_factory=dict)  # item id -> why it was not sent (not implemented, ...)
    loaded: bool = False
    load_errors: dict[str, protocol.LoadFailure] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # for the student, not failures (a long compilation)
    logs: list[str] = field(default_factory=list)
    profile: dict[str, float] = field(default_factory=dict)  # seconds per step
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds of the workers per step
    to_time: list[tuple[Item, protocol.RunSpeed, protocol.SpeedDone]] = field(default_factory=list)  # defer_speed

    def add_time(self, step: str, seconds: float) -> None:
        self.profile[step] = self.profile.get(step, 0.0) + seconds

    def add_cpu(self, step: str, seconds: float) -> None:
        self.cpu[step] = self.cpu.get(step, 0.0) + seconds

    @classmethod
    def merged(cls, runs: list[Run]) -> Run:
        """The runs of one exercise's parts (each in workers of its own) as one."""
        out = cls(loaded=bool(runs) and all(r.loaded for r in runs))
        for run in runs:
            out.replies.update(run.replies)
            out.failed.update(run.failed)
            out.not_run.update(run.not_run)
            out.load_errors.update(run.load_errors)
            out.problems += [p for p in run.problems if p not in out.problems]
            out.notes += [n for n in run.notes if n not in out.notes]
            out.logs += run.logs
            out.to_time += run.to_time
            for step, seconds in run.profile.items():
                out.add_time(step, seconds)
            for step, seconds in run.cpu.items():
                out.add_cpu(step, seconds)
        return out
