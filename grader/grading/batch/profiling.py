"""``grader grade --profile``: the batch's wall time, submissions per hour, host CPU use (and whose: the grader's own
process, or the workers and timers it started), each GPU's turns alone, and the batch window by window
(:mod:`~grader.grading.batch.timeline`)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

from grader.grading.batch.grader_load import GraderLoad
from grader.grading.batch.progress import Progress
from grader.grading.batch.result_commits import cpu_text
from grader.grading.batch.scheduler import Task
from grader.grading.batch.timeline import Timeline, host_cpu
from grader.grading.exercise_run import gpu_references
from grader.grading.exercise_run.slots import Slot
from grader.grading.results import store


def own_cpu() -> float:
    """CPU seconds (user + system, every thread) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def report(progress: Progress, slots: list[Slot], *, submissions: int,
           cpu_before: tuple[float, float] | None = None, own_before: float | None = None,
           load: GraderLoad | None = None, cpu_by_step: dict[str, float] | None = None,
           timeline: Timeline | None = None) -> None:
    """``grader grade --profile``: the batch's wall time, submissions per hour, and how long each GPU was held alone
    (autotuning, recording and timed rounds) — the part of the work that cannot overlap; ``load``: what the grader's
    own process was busy with, and how crowded its interpreter was; ``cpu_by_step``: the CPU seconds of the runs'
    workers and timers, per step; ``timeline``: the batch window by window."""
    wall = time.monotonic() - progress.started
    lines = [_header(submissions, progress.done, wall)]
    host = _host_since(cpu_before)
    if host is not None:
        busy, host_s = host
        lines.append(f"  host CPU busy {100 * busy:.0f}% of {os.cpu_count()} cores on average")
        if own_before is not None:  # a sandbox's processes escape RUSAGE_CHILDREN: the rest of the host is theirs
            own = own_cpu() - own_before
            per = f" ({host_s / submissions:.0f} s per submission)" if submissions else ""
            lines.append(f"  CPU time {host_s:.1f} s on the host{per}: the grader's own process {own:.1f} s "
                         f"(planning, building inputs, judging, float64 references), the rest "
                         f"{max(0.0, host_s - own):.1f} s (its workers and trusted timers: sandboxes, imports, "
                         "compiling, the student's code, replays; and whatever else the host ran)")
    if cpu_by_step:
        lines.append(processes_cpu_text(cpu_by_step, submissions, wall=wall))
    if load is not None and own_before is not None:
        lines.append(load.text(own_cpu() - own_before))
    for slot in slots:
        if slot.is_gpu:
            arbiter = slot.arbiter
            assert arbiter is not None
            lines.append(f"  {slot.describe()}: {slot.capacity} run(s) at once; held alone {arbiter.alone_s:.1f} s "
                         f"({100 * arbiter.alone_s / wall if wall > 0 else 0:.0f}% of the wall time"
                         f"{alone_text(dict(arbiter.alone_by_role))}) in "
                         f"{arbiter.alone_count} turn(s), {arbiter.chained} of them right after another; "
                         f"waiting for the others' GPU work before them "
                         f"{arbiter.drain_s:.1f} s in all, for their turn (that wait included) {arbiter.queue_s:.1f} s")
            if arbiter.held_up_by:
                lines.append("    the last to pause before a turn: " + held_up_text(arbiter.held_up_by))
            if arbiter.blocked_by_role:
                lines.append("    " + blocked_text(dict(arbiter.blocked_by_role)))
            refs = gpu_references.of(arbiter)
            if refs is not None:
                lines.append(f"    the grader's float64 references: {refs.on_gpu} on this GPU, {refs.on_cpu} on the CPU"
                             + (f" (the CPU took over: {refs.broken})" if refs.broken else ""))
    if timeline is not None:
        lines.append(timeline.text(slots, wall))
    progress.note("\n".join(lines))


def split_report(out: Path, tasks: list[Task], left: list[Task], *, processes: int, wall: float,
                 cpu_before: tuple[float, float] | None) -> str:
    """``--profile`` of a batch split over grader processes (each printed its own above): the batch's wall time and
    rate, the host's CPU, and the CPU of every run's workers and timers by step, from the results in ``out``."""
    submissions = len({t.student for t in tasks})
    lines = [_header(submissions, len(tasks) - len(left), wall, f" over {processes} grader processes")
             + "; each process's own profile is above, under its name"]
    host = _host_since(cpu_before)
    if host is not None:
        busy, host_s = host
        per = f" ({host_s / submissions:.0f} s per submission)" if submissions else ""
        lines.append(f"  host CPU busy {100 * busy:.0f}% of {os.cpu_count()} cores on average; CPU time {host_s:.1f} s"
                     f"{per}: the grader processes, their workers and trusted timers, and whatever else the host ran")
    steps: dict[str, float] = {}
    done = {(t.student, t.exercise.name) for t in tasks} - {(t.student, t.exercise.name) for t in left}
    for student in sorted({s for s, _ in done}):
        try:
            results = store.load_exercises(out, student)
        except (OSError, ValueError):
            continue
        for name, result in results.items():
            if (student, name) in done:
                for step, seconds in result.cpu.items():
                    steps[step] = steps.get(step, 0.0) + seconds
    if steps:
        lines.append(processes_cpu_text(steps, submissions, wall=wall))
    return "\n".join(lines)


def _header(submissions: int, runs: int, wall: float, where: str = "") -> str:
    return (f"batch profile: {submissions} submission(s), {runs} exercise run(s) in {wall:.1f} s wall{where}"
            + (f" ({submissions * 3600 / wall:.0f} submissions per hour)" if wall > 0 and submissions else ""))


def _host_since(cpu_before: tuple[float, float] | None) -> tuple[float, float] | None:
    """The host's cores since ``cpu_before`` (:func:`host_cpu`): the share busy, and the busy CPU seconds."""
    cpu_after = host_cpu()
    if cpu_before is None or cpu_after is None or cpu_after[1] <= cpu_before[1]:
        return None
    busy = cpu_after[0] - cpu_before[0]
    return busy / (cpu_after[1] - cpu_before[1]), busy / os.sysconf("SC_CLK_TCK")


def processes_cpu_text(cpu_by_step: dict[str, float], submissions: int, *, wall: float = 0.0) -> str:
    """The workers' and timers' CPU by step, largest first (a worker's read from /proc as each step ends, a trusted
    timer's as it says when it ends). With the batch's ``wall`` time, a second line: the wall time per second of
    that CPU. The host's speed moves the CPU the same work needs by up to a fifth from one batch to the next, and
    the wall time with it, while this figure stays put (docs/performance.md): a change to how runs share the host
    is judged by it, not by a pair of wall times."""
    text = f"  the workers' and trusted timers' CPU {cpu_text(cpu_by_step, submissions)}"
    total = sum(cpu_by_step.values())
    if wall > 0 and total > 0:
        text += f"\n  the batch's wall time per second of that CPU: {wall / total:.3f} s"
    return text


ROLES = {"worker": "workers", "timer": "trusted timers", "grader": "the grader's references"}


ALONE = {"worker": "the workers' autotuning", "timer": "the trusted timers' rounds", "grader": "the grader's own"}


def alone_text(alone_by_role: dict[str, float]) -> str:
    """What the GPU was held alone for, by whom (", the trusted timers' rounds 55.6 s, the workers' autotuning
    58.4 s")."""
    return "".join(f", {ALONE.get(role, role)} {seconds:.1f} s"
                   for role, seconds in sorted(alone_by_role.items(), key=lambda kv: -kv[1]))


def blocked_text(blocked_by_role: dict[str, float]) -> str:
    """How long the processes waited to use the GPU while it was held alone, by role: the work the turns held up
    (a process paused while it compiles is not counted)."""
    roles = ", ".join(f"{ROLES.get(role, role)} {seconds:.1f} s" for role, seconds in
                      sorted(blocked_by_role.items(), key=lambda kv: -kv[1]))
    return f"waiting to use the GPU while it was held alone (held up, not compiling): {roles}"


def held_up_text(held_up_by: dict[tuple[str, str], list[float]]) -> str:
    """Whose GPU work the turns waited for the longest: per role, then what it was running (longest first)."""
    roles: dict[str, list[float]] = {}
    for (role, _), (turns, seconds) in held_up_by.items():
        total = roles.setdefault(role, [0, 0.0])
        total[0] += turns
        total[1] += seconds
    parts = []
    for role, (turns, seconds) in sorted(roles.items(), key=lambda kv: -kv[1][1]):
        doing = sorted(((d, v) for (r, d), v in held_up_by.items() if r == role and d), key=lambda kv: -kv[1][1])
        detail = f" ({'; '.join(f'{d} {v[1]:.1f} s in {v[0]:.0f}' for d, v in doing)})" if doing else ""
        parts.append(f"{ROLES.get(role, role)} {seconds:.1f} s in {turns:.0f} turn(s){detail}")
    return ", ".join(parts)
