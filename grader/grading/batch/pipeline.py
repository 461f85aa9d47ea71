"""The machinery of a grading batch (:mod:`grader.grading.commands.grade` drives it; a Slurm array task runs it too).

A batch is a list of tasks, one per (student, exercise). This module prepares the submissions, checks that
the output folder holds this batch or none (:mod:`grader.grading.batch.resume`) and that nobody else is grading it,
records the batch (``run.json``, each submission's record), lists the tasks left to grade, runs them on this
machine's slots (:mod:`grader.grading.batch.scheduler`) committing each result as it comes
(:mod:`grader.grading.batch.recorder`), and rebuilds the gradebook and the class report from the folder
(:mod:`grader.grading.results.rebuild`).

Its :class:`Workspace` holds the scratch directory and the batch's token; its reaper
(:mod:`grader.grading.isolation.reaper`) kills the workers and removes the directory however the process ends, and
SIGTERM stops the batch like Ctrl-C.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading import config
from grader.grading.batch import gpus, markers, resume, slurm, submission
from grader.grading.batch.progress import Progress
from grader.grading.batch.recorder import Recorder
from grader.grading.batch.scheduler import Scheduler, Task, estimate, static_estimate
from grader.grading.exercise_run import references, runner
from grader.grading.exercise_run.slots import Slot
from grader.grading.isolation import bwrap, processes, reaper
from grader.grading.results import rebuild, reports, store
from grader.grading.results.results import ERROR, UNREADABLE, ExerciseResult


class UsageError(Exception):
    pass


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop like Ctrl-C."""


@dataclass
class Batch:
    out: Path
    reports: list[reports.StudentReport]
    exercises: tuple[Exercise, ...]
    elapsed_s: float
    device: str
    graded: int = 0  # exercise runs this command graded
    left: int = 0  # exercise runs it could not grade
    left_reason: str = ""
    submitted: str = ""  # Slurm, not waited for: what was submitted

    def regrade_parts(self) -> list[str]:
        return [f"{r.student}: {p}" for r in self.reports for p in r.regrade_parts()]


@dataclass
class Context:
    """What every exercise run of a batch shares."""

    out: Path
    course: config.Course
    all_exercises: tuple[Exercise, ...]
    selected: tuple[Exercise, ...]
    settings: config.RunSettings
    device: str  # "cpu" | "cuda": where the tasks grade
    description: str  # the device, for the reports
    batch: str  # the token every worker of this process carries (the reaper's)
    course_file: Path | None = None
    sandbox_note: str = ""  # where student code runs, as every report says it
    unsandboxed: bool = False  # the instructor opted out of the sandbox (a batch is never mixed)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.selected]

    def identity(self) -> dict:
        """What run.json records of this run, and a resumed batch must share."""
        s = self.settings
        return {"device": self.description, "device_kind": self.device, "gpu": s.gpu_name, "exercises": self.names,
                "random_cases": s.random_cases, "timeout_s": s.timeout_s, "call_timeout_s": s.call_timeout_s,
                "memory_mb": s.memory_mb, "course": self.course.source,
                "course_file": str(self.course_file) if self.course_file else None,
                "course_fingerprint": self.course.fingerprint(), "course_decisions": self.course.decisions(),
                "correctness": self.course.correctness, "sandbox": self.sandbox_note,
                "unsandboxed": self.unsandboxed}


class Workspace:
    """The batch's private scratch directory and token; the reaper that kills its workers and removes the
    directory however this process ends; SIGTERM handled like Ctrl-C."""

    def __init__(self, keep: bool):
        self.keep = keep

    def __enter__(self) -> Workspace:
        self.dir = Path(tempfile.mkdtemp(prefix="grader-"))
        os.chmod(self.dir, 0o700)
        self.token = secrets.token_hex(16)
        self.reaper = reaper.Reaper(self.token, None if self.keep else str(self.dir))
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, _terminate)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        processes.kill_active()
        self.reaper.close()
        if self.keep:
            print(f"scratch directory kept: {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def _terminate(signum, frame) -> None:
    raise Terminated()


def _select(all_exercises: tuple[Exercise, ...], names: tuple[str, ...]) -> tuple[Exercise, ...]:
    if not names:
        return all_exercises
    known = {e.name: e for e in all_exercises}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown exercise(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return tuple(e for e in all_exercises if e.name in names)


def resolve_secret(options: config.GradeOptions, out: Path) -> tuple[str, str, bool]:
    """The secret, where it came from, and whether it is new (to be written to the folder)."""
    if options.secret:
        return options.secret, "--secret", False
    if os.environ.get("GRADER_SECRET"):
        return os.environ["GRADER_SECRET"], "$GRADER_SECRET", False
    kept = store.read_secret(out)
    if kept:
        return kept, store.SECRET_FILE, False
    return secrets.token_hex(16), store.SECRET_FILE, True


def choose_sandbox(options: config.GradeOptions, out: Path, workdir: Path, *,
                   local: bool = True) -> tuple[bwrap.Sandbox | None, str]:
    """The sandbox the workers run in and how the reports say so. Where none can be built, grading is refused
    (UsageError) unless the instructor opted out with --unsandboxed. Not ``local`` (a Slurm batch submitted from
    here): each task checks on the node it runs on."""
    from grader.checks import runtime

    if options.unsandboxed:
        note = "WITHOUT a sandbox (the instructor passed --unsandboxed)"
        print(f"grader grade: warning: grading {note}: student code reaches whatever this user can", file=sys.stderr)
        return None, note
    if not local:
        return None, "in a bubblewrap sandbox on the nodes that ran it"
    protected = [p for p in (out, workdir, bwrap.repository_root()) if p is not None]
    found = bwrap.check(runtime.configure().device, protected=protected)
    if found.sandbox is None:
        raise UsageError(f"no sandbox for student code can be built here: {found.problem}. Fix that, or pass "
                         "--unsandboxed to grade without one (said in run.json and in every report)")
    return found.sandbox, f"in {found.sandbox.description}"


def make_context(out: Path, options: config.GradeOptions, *, secret: str, work: Workspace,
                 device: str | None = None,
                 sandbox: tuple[bwrap.Sandbox | None, str] = (None, "")) -> Context:
    """``device``: where the tasks grade, when not here (a Slurm batch submitted from a login node);
    ``sandbox``: from :func:`choose_sandbox`."""
    from grader import exercises as registry
    from grader.checks import runtime

    mode = runtime.configure()
    device = device or mode.device
    all_ex = registry.all_exercises()
    course = config.load_course(options.course, known=tuple(e.name for e in all_ex))
    selected = _select(all_ex, options.exercises)
    settings = config.resolve(options, course, device=device, secret=secret, workdir=work.dir,
                              gpu_name=mode.gpu_name if device == mode.device else None, sandbox=sandbox[0])
    settings = replace(settings, env={**settings.env, reaper.BATCH_VAR: work.token},
                       references=references.ReferenceStore(out / store.REFERENCES, secret))
    description = mode.description if device == mode.device else f"{device.upper()} through Slurm"
    return Context(out, course, all_ex, selected, settings, device, description, work.token, options.course,
                   sandbox_note=sandbox[1], unsandboxed=options.unsandboxed)


def check_paths(paths: list[str]) -> None:
    for path in map(Path, paths):
        if not path.exists():
            raise UsageError(f"{path}: no such file or directory")


def recorded_run(out: Path) -> dict:
    try:
        return store.read_run(out)
    except (OSError, ValueError):
        raise UsageError(f"{out}: no grading run here (no readable {store.RUN_FILE})") from None


def recorded_options(recorded: dict, options: config.GradeOptions) -> config.GradeOptions:
    """The options that decide scores, as the batch recorded them."""
    course = recorded.get("course_file") or recorded.get("course")
    return options.replace(
        exercises=tuple(recorded["exercises"]), random_cases=recorded["random_cases"],
        timeout_s=recorded["timeout_s"], call_timeout_s=recorded["call_timeout_s"],
        memory_mb=recorded["memory_mb"], course=Path(course) if course else None,
        unsandboxed=bool(recorded.get("unsandboxed", False)))


def reprepare(out: Path, student: str, dest: Path, selected: tuple[Exercise, ...]) -> submission.Submission:
    """A student's submission prepared again from where it came from, refused if its files changed."""
    meta = store.load_submission(out, student)
    source = Path(meta["source"])
    if not source.exists():
        raise UsageError(f"{student}: the submission {source} is gone; it cannot be graded again")
    sub = submission.prepare(source, dest, selected)
    sub.student = student
    if meta.get("content_hash") not in (None, resume.content_hash(sub)):
        raise resume.refuse(out, [f"the files of {student} ({source}) changed since they were graded"],
                            hint="grade them again with: grader grade ... --regrade-changed")
    return sub


def prepare_all(sources: list[Path], workdir: Path, selected: tuple[Exercise, ...],
                solutions_id: str | None) -> list[submission.Submission]:
    """Every submission copied into ``workdir``, with unique student ids."""
    subs, used = [], set()
    for i, path in enumerate(sources):
        sub = submission.prepare(path, workdir / f"sub{i}", selected)
        if solutions_id:
            sub.student = solutions_id
        base, n = sub.student, 2
        while sub.student in used:
            sub.student, n = f"{base}-{n}", n + 1
        used.add(sub.student)
        subs.append(sub)
    return subs


def check_idle(out: Path) -> None:
    """Refuse to grade into a folder that another live process (or a queued Slurm batch) is grading;
    clear what a dead one left behind (its processes, by token, should its reaper have failed too; and
    temporary files of writes it did not finish)."""
    active = slurm.active_batch_jobs(out)
    if active:
        raise UsageError(f"{out}: Slurm job(s) {', '.join(sorted(active))} of this batch are still queued or "
                         f"running; wait for them (grader status {out}) or cancel them (scancel)")
    busy, dead = [], set()
    for student, exercise, data, age in store.read_markers(out):
        life = markers.liveness(data, age, active)
        if life.alive:
            busy.append(f"{student}/{exercise} ({life.why})")
        elif life.same_host and data.get("batch"):
            dead.add(str(data["batch"]))
    if busy:
        raise UsageError(f"{out} is being graded right now: {', '.join(busy[:5])}"
                         f"{' ...' if len(busy) > 5 else ''}; wait for it to finish or stop it")
    for batch in dead:
        reaper.kill_batch(batch)
    store.remove_temporary_files(out)


def open_batch(ctx: Context, subs: list[submission.Submission], *, secret: str, secret_source: str,
               new_secret: bool, options: config.GradeOptions) -> None:
    """Check that the folder holds this batch or none, then record the batch and its submissions."""
    out = ctx.out
    hashes = {s.student: resume.content_hash(s) for s in subs}
    recorded = None
    if (out / store.RUN_FILE).exists():
        try:
            recorded = store.read_run(out)
        except (OSError, ValueError):
            raise resume.refuse(out, [f"its {store.RUN_FILE} cannot be read"]) from None
    if recorded:
        if new_secret:
            raise resume.refuse(out, [f"it was graded with a secret from {recorded.get('secret')}, and none was "
                                      "given now"], hint="give the same secret (--secret or $GRADER_SECRET)")
        problems = resume.conflicts(recorded, ctx.identity(), secret)
        if problems:
            raise resume.refuse(out, problems)
        changed = resume.changed_submissions(out, subs, hashes)
        if changed and not options.regrade_changed:
            raise resume.refuse(out, [f"the files of {c.student} ({c.source}) changed since they were graded"
                                      for c in changed],
                                hint="to grade the new files from scratch, add --regrade-changed; to grade "
                                "everything again, --fresh")
        for sub in changed:
            store.forget_student(out, sub.student)
    if new_secret:
        store.write_secret(out, secret)
    current = {**ctx.identity(), "submissions": {s.student: str(s.source.resolve()) for s in subs}}
    if not recorded:
        salt = secrets.token_hex(8)
        current.update(secret=secret_source, secret_salt=salt,
                       secret_fingerprint=resume.secret_fingerprint(secret, salt))
    store.write_run(out, resume.merged_record(recorded, current, [e.name for e in ctx.all_exercises]))
    for sub in subs:
        store.save_submission(out, sub.student, {
            "source": str(sub.source.resolve()), "kind": sub.kind, "problems": sub.problems,
            "content_hash": hashes[sub.student], "display_name": sub.display_name})


def pending_tasks(ctx: Context, subs: list[submission.Submission]) -> list[Task]:
    """The tasks the folder has no final result for: never graded, died, or needing a regrade."""
    found = {}
    history: dict[str, list[float]] = {}
    for sub in subs:
        try:
            found[sub.student] = store.load_exercises(ctx.out, sub.student)
        except (OSError, ValueError) as exc:  # an unreadable record is graded again
            print(f"grader grade: {sub.student}: a stored result cannot be read ({exc}); grading again",
                  file=sys.stderr)
            found[sub.student] = {}
        for result in found[sub.student].values():
            history.setdefault(result.exercise, []).append(result.elapsed_s)
    tasks = []
    for sub in subs:
        for exercise in ctx.selected:
            previous = found[sub.student].get(exercise.name)
            if previous is not None and not previous.needs_regrade:
                continue
            static = static_estimate(exercise, device=ctx.device, random_cases=ctx.settings.random_cases,
                                     speed_budget_s=ctx.settings.speed_budget_s)
            tasks.append(Task(sub.student, exercise, sub, previous, estimate(exercise, previous, history, static)))
    return tasks


def local_slots(ctx: Context, options: config.GradeOptions, *, available: list[gpus.Gpu] | None = None,
                current: int | None = None) -> list[Slot]:
    """CPU worker places (``--jobs``), or the chosen GPUs (``--gpus``) with ``--jobs`` runs each; the GPUs
    are this machine's unless ``available`` (and ``current``) say otherwise."""
    jobs = options.jobs or ctx.course.setting("jobs", ctx.device)
    if ctx.device != "cuda":
        return gpus.cpu_slots(jobs)
    available = gpus.visible() if available is None else available
    current = gpus.current_index() if current is None else current
    return gpus.gpu_slots(options.gpus, jobs, available=available, current=current)


def _grade_task(ctx: Context, work: Workspace, recorder: Recorder, task: Task, slot: Slot) -> ExerciseResult:
    recorder.started(task, slot)
    sub, exercise = task.submission, task.exercise
    if not sub.usable:
        return ExerciseResult(exercise.name, exercise.title, ERROR, UNREADABLE + "; ".join(sub.problems),
                              device=dict(slot.device))
    parts = tuple(task.previous.regrade_parts()) if task.previous is not None else None
    result = runner.grade_exercise(exercise, sub.root, settings=ctx.settings,
                                   scratch=work.dir / f"scratch-{sub.student}-{exercise.name}",
                                   cache_dir=work.dir / f"triton-cache-{sub.student}", parts=parts, slot=slot)
    if task.previous is None or set(parts or ()) >= {p.name for p in exercise.parts}:
        return result  # graded whole: nothing of the previous run is kept
    return runner.merge_regrade(task.previous, result)


def run_local(ctx: Context, tasks: list[Task], work: Workspace, options: config.GradeOptions, description: str,
              *, students: list[str], gradebook: bool = True) -> tuple[int, list[Task]]:
    """Run ``tasks`` on this machine's slots, committing each result; (committed, left ungraded)."""
    slots = local_slots(ctx, options)
    run = store.read_run(ctx.out)
    where = ", ".join(s.describe() + (f" × {s.capacity} runs" if s.capacity > 1 else "") for s in slots)
    progress = Progress(len(tasks), f"{description} ({where})", per_submission=len(ctx.selected))
    recorder = Recorder(ctx.out, course=ctx.course, all_exercises=ctx.all_exercises, names=run["exercises"],
                        device=run.get("device", ctx.description), students=students, batch=ctx.batch,
                        gradebook=gradebook, progress=progress, profile=options.profile,
                        sandbox=run.get("sandbox", ctx.sandbox_note))
    cpu_before = _host_cpu()
    scheduler = Scheduler(slots, lambda task, slot: _grade_task(ctx, work, recorder, task, slot), recorder.commit,
                          probe=gpus.probe_slot, on_failure=recorder.gpu_failure)
    try:
        outcome = scheduler.run(tasks)
    except KeyboardInterrupt:
        scheduler.stop()  # first: nothing a killed worker returns is recorded
        processes.kill_active()
        raise
    finally:
        progress.stop()
        recorder.close()
    if options.profile:
        _batch_profile(progress, slots, submissions=len({t.student for t in tasks}), cpu_before=cpu_before)
    if outcome.left:
        print(f"grader grade: every slot failed ({'; '.join(s.failed or '' for s in slots)}); "
              f"{len(outcome.left)} exercise run(s) left ungraded", file=sys.stderr)
    return outcome.committed, outcome.left


def _host_cpu() -> tuple[float, float] | None:
    """(busy, total) CPU time of the whole host so far, in clock ticks (Linux's /proc/stat; None elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            fields = [float(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _batch_profile(progress: Progress, slots: list[Slot], *, submissions: int,
                   cpu_before: tuple[float, float] | None = None) -> None:
    """``grader grade --profile``: the batch's wall time, submissions per hour, and how long each GPU was held alone
    (autotuning, recording and timed rounds) — the part of the work that cannot overlap."""
    import time

    wall = time.monotonic() - progress.started
    lines = [f"batch profile: {submissions} submission(s), {progress.done} exercise run(s) in {wall:.1f} s wall"
             + (f" ({submissions * 3600 / wall:.0f} submissions per hour)" if wall > 0 and submissions else "")]
    cpu_after = _host_cpu()
    if cpu_before is not None and cpu_after is not None and cpu_after[1] > cpu_before[1]:
        busy = (cpu_after[0] - cpu_before[0]) / (cpu_after[1] - cpu_before[1])
        lines.append(f"  host CPU busy {100 * busy:.0f}% of {os.cpu_count()} cores on average")
    for slot in slots:
        if slot.is_gpu:
            arbiter = slot.arbiter
            assert arbiter is not None
            lines.append(f"  {slot.describe()}: {slot.capacity} run(s) at once; held alone {arbiter.alone_s:.1f} s "
                         f"({100 * arbiter.alone_s / wall if wall > 0 else 0:.0f}% of the wall time) in "
                         f"{arbiter.alone_count} turn(s); waiting for the others' GPU work before them "
                         f"{arbiter.drain_s:.1f} s in all")
    progress.note("\n".join(lines))


def finish(ctx: Context, elapsed: float, title: str, done: int, left: list[Task]) -> Batch:
    students = rebuild.rebuild(ctx.out, course=ctx.course, all_exercises=ctx.all_exercises)
    batch = Batch(ctx.out, students, ctx.selected, elapsed, store.read_run(ctx.out).get("device", ctx.description),
                  graded=done, left=len(left), left_reason="no usable GPU was left" if left else "")
    summary(ctx, batch, title)
    return batch


def summary(ctx: Context, batch: Batch, title: str) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=True, highlight=False, width=160)  # logs: no wrapping of the table
    names = list(store.read_run(ctx.out)["exercises"])
    console.print(reports.summary_table(batch.reports, names, title=f"{title} ({batch.device})"))
    console.print(f"graded {batch.graded} exercise run(s) in {batch.elapsed_s:.1f} s ({ctx.settings.random_cases} "
                  f"random case(s) per part); class report: {ctx.out / store.CLASS_REPORT_HTML}")
    ungradable = [(r.student, r.ungradable) for r in batch.reports if r.ungradable]
    if ungradable:
        console.print(f"[red]{len(ungradable)} submission(s) had nothing that could be graded:[/]")
        for student, reason in ungradable:
            console.print(f"  {student}: {reason}", highlight=False, markup=False)
