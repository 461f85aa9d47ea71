"""The sequence every grading batch goes through, written once: :func:`run_batch` runs the :class:`Plan` a command
supplies (:mod:`grader.grading.commands.grade`: local grading, Slurm submission, a regrade of errors;
:mod:`grader.grading.commands.grade_task`: one Slurm array task, or one share of a batch split over grader
processes, :mod:`grader.grading.batch.split`).

The sequence: the batch's secret (:mod:`grader.grading.batch.batch_secret`), a scratch workspace and the shared context
(:mod:`grader.grading.batch.context`); the submissions prepared; the folder checked to hold this batch or none
(:mod:`grader.grading.batch.resume`) and nobody else grading it; the batch recorded (``run.json``, each submission's
record); the tasks left, one per (student, exercise), run on this machine's slots
(:mod:`grader.grading.batch.scheduler`) with each result committed as it comes
(:mod:`grader.grading.batch.result_commits`), or split over one grader process per GPU; the gradebook and the class
report rebuilt from the folder
(:mod:`grader.grading.results.rebuild`).
"""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading import config
from grader.grading.batch import gpus, grader_load, markers, profiling, resume, slurm, split, submission
from grader.grading.batch.batch_secret import Secret
from grader.grading.batch.context import Context, UsageError, Workspace, choose_sandbox, make_context, signals_held
from grader.grading.batch.progress import Progress
from grader.grading.batch.result_commits import Recorder
from grader.grading.batch.scheduler import Scheduler, Task, estimate, niceness, static_estimate
from grader.grading.batch.summary import summary
from grader.grading.batch.timeline import Timeline
from grader.grading.config import RunSettings
from grader.grading.exercise_run import runner
from grader.grading.exercise_run.slots import Slot
from grader.grading.isolation import processes, reaper, threads
from grader.grading.results import rebuild, reports, store
from grader.grading.results.results import ERROR, UNREADABLE, ExerciseResult


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


class NotThisBatch(resume.Conflict):
    """The folder holds a batch other than the recorded one this run joins."""


@dataclass
class Plan:
    """What a command supplies to :func:`run_batch`; the rest of the sequence is the same for all."""

    options: config.GradeOptions
    secret: Secret
    prepare: Callable[[Context, Path], list[submission.Submission]]  # the submissions, under the scratch directory
    describe: Callable[[Context, list[submission.Submission], list[Task]], str]  # the progress line's title
    title: str | None  # the summary's; None: a Slurm array task or a split batch's share (whose merge job or parent
    # writes the gradebook and the summary)
    joins: dict | None = None  # run.json of the recorded batch this run joins; None: the batch is opened now
    hint: str = ""  # how to get past a conflict with the joined batch
    only_previous: bool = False  # grade only tasks with a result already (a regrade)
    only: frozenset[tuple[str, str]] | None = None  # grade only these (student, exercise) runs (a split's share)
    exclusive: bool = True  # refuse a folder someone else grades (not an array task: its siblings grade it too)
    device: str | None = None  # where the tasks grade, when not here (Slurm submitted from a login node)
    elsewhere: Callable[[Context, list[Task], float], Batch] | None = None  # hands the tasks to Slurm instead


def run_batch(out: Path, plan: Plan) -> Batch:
    """Grade ``plan``'s submissions into ``out``. Usage problems raise UsageError, a folder holding another batch
    resume.Conflict."""
    options, start = plan.options, time.monotonic()
    with Workspace(options.keep_work) as work:
        sandbox = choose_sandbox(options, out, work.dir, local=plan.device is None)
        if plan.joins is not None:  # the reports say where the batch ran, as recorded
            sandbox = (sandbox[0], plan.joins.get("sandbox", sandbox[1]))
        ctx = make_context(out, options, secret=plan.secret.value, work=work, device=plan.device, sandbox=sandbox)
        # grader processes to split the runs over (asked for before anything is recorded: a usage error records none)
        n = split.count(ctx, options) if plan.title is not None and plan.elsewhere is None else 1
        if plan.joins is None:
            subs = plan.prepare(ctx, work.dir)
            check_idle(out)
            open_batch(ctx, subs, plan.secret, options)
        else:
            problems = resume.conflicts(plan.joins, ctx.identity(), plan.secret.value)
            if problems:
                raise NotThisBatch(str(resume.refuse(out, problems, hint=plan.hint)))
            if plan.exclusive:
                check_idle(out)
            subs = plan.prepare(ctx, work.dir)
        tasks = pending_tasks(ctx, subs)
        if plan.only_previous:
            tasks = [t for t in tasks if t.previous is not None]
        if plan.only is not None:
            tasks = [t for t in tasks if (t.student, t.exercise.name) in plan.only]
        if plan.elsewhere is not None:
            return plan.elsewhere(ctx, tasks, start)
        if n > 1 and tasks:
            shares = split.shares(ctx, options, tasks, n)
            if len(shares) > 1:  # one submission stays in this process: its parts run side by side on one GPU
                return run_split(ctx, subs, tasks, options, plan, shares, start)
        gradebook = plan.title is not None
        done, left = run_local(ctx, tasks, work, options, plan.describe(ctx, subs, tasks), gradebook=gradebook,
                               students=store.students(out) if gradebook else [s.student for s in subs])
        if plan.title is None:
            return Batch(out, [], ctx.selected, time.monotonic() - start, ctx.description, graded=done,
                         left=len(left))
        return finish(ctx, time.monotonic() - start, plan.title, done, left)


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
    yardstick = resume.recorded_yardstick(recorded)
    return options.replace(
        exercises=tuple(recorded["exercises"]), random_cases=recorded["random_cases"],
        timeout_s=recorded["timeout_s"], call_timeout_s=recorded["call_timeout_s"],
        memory_mb=recorded["memory_mb"], course=Path(course) if course else None,
        unsandboxed=bool(recorded.get("unsandboxed", False)),
        yardstick=options.yardstick if yardstick is None else yardstick)


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


def open_batch(ctx: Context, subs: list[submission.Submission], secret: Secret, options: config.GradeOptions) -> None:
    """Check that the folder holds this batch or none (``--fresh``: none, once cleared), then record the batch and
    its submissions."""
    out = ctx.out
    if options.fresh:
        store.clear_results(out)
        if secret.source != store.SECRET_FILE and store.read_secret(out) not in (None, secret.value):
            (out / store.SECRET_FILE).unlink()  # another batch's secret: it would be mistaken for this one's
    hashes = {s.student: resume.content_hash(s) for s in subs}
    recorded = None
    if (out / store.RUN_FILE).exists():
        try:
            recorded = store.read_run(out)
        except (OSError, ValueError):
            raise resume.refuse(out, [f"its {store.RUN_FILE} cannot be read"]) from None
    if recorded:
        if secret.new:
            raise resume.refuse(out, [f"it was graded with a secret from {recorded.get('secret')}, and none was "
                                      "given now"], hint="give the same secret (--secret or $GRADER_SECRET)")
        problems = resume.conflicts(recorded, ctx.identity(), secret.value)
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
    if secret.new:
        store.write_secret(out, secret.value)
    current = {**ctx.identity(), "submissions": {s.student: str(s.source.resolve()) for s in subs}}
    if not recorded:
        salt = secrets.token_hex(8)
        current.update(secret=secret.source, secret_salt=salt,
                       secret_fingerprint=resume.secret_fingerprint(secret.value, salt))
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


def planned_work(tasks: list[Task]) -> dict[str, tuple[str, float]]:
    """Each task's exercise and planned seconds, for the progress line's estimate of the end."""
    return {task.key: (task.exercise.name, task.estimate_s) for task in tasks}


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


def _grade_task(ctx: Context, work: Workspace, recorder: Recorder, task: Task, slot: Slot,
                settings: RunSettings | None = None) -> ExerciseResult:
    recorder.started(task, slot)
    sub, exercise = task.submission, task.exercise
    if not sub.usable:
        return ExerciseResult(exercise.name, exercise.title, ERROR, UNREADABLE + "; ".join(sub.problems),
                              device=dict(slot.device))
    parts = tuple(task.previous.regrade_parts()) if task.previous is not None else None
    result = runner.grade_exercise(exercise, sub.root, settings=settings or ctx.settings,
                                   scratch=work.dir / f"scratch-{sub.student}-{exercise.name}",
                                   cache_dir=work.dir / f"triton-cache-{sub.student}", parts=parts, slot=slot,
                                   on_workers_ended=task.workers_ended)
    if task.previous is None or set(parts or ()) >= {p.name for p in exercise.parts}:
        return result  # graded whole: nothing of the previous run is kept
    return runner.merge_regrade(task.previous, result)


def run_local(ctx: Context, tasks: list[Task], work: Workspace, options: config.GradeOptions, description: str,
              *, students: list[str], gradebook: bool = True) -> tuple[int, list[Task]]:
    """Run ``tasks`` on this machine's slots, committing each result; (committed, left ungraded)."""
    slots = local_slots(ctx, options)
    run = store.read_run(ctx.out)
    where = ", ".join(s.describe() + (f" × {s.capacity} runs" if s.capacity > 1 else "") for s in slots)
    progress = Progress(len(tasks), f"{description} ({where})", per_submission=len(ctx.selected),
                        work=planned_work(tasks))
    recorder = Recorder(ctx.out, course=ctx.course, all_exercises=ctx.all_exercises, names=run["exercises"],
                        device=run.get("device", ctx.description), students=students, batch=ctx.batch,
                        gradebook=gradebook, progress=progress, profile=options.profile,
                        sandbox=run.get("sandbox", ctx.sandbox_note))
    cpu_before, own_before = profiling.host_cpu(), profiling.own_cpu()
    load = grader_load.GraderLoad().start() if options.profile else None
    timeline = Timeline(progress.started).start() if options.profile else None
    # room for more runs than the batch has (one submission, say): each speed measurement in a worker of its own,
    # and each worker's cases compiled at once before they run (the host has cores to spare)
    room = ctx.device == "cuda" and len(tasks) < sum(s.capacity for s in slots)
    settings = replace(ctx.settings, speed_apart=room, compile_ahead=room)
    longest = max((task.estimate_s for task in tasks), default=0.0)

    def grade_task(task: Task, slot: Slot) -> ExerciseResult:  # the longest runs' workers get the cores first
        nice, started = niceness(task.estimate_s, longest), time.monotonic()
        try:
            return _grade_task(ctx, work, recorder, task, slot, replace(settings, nice=nice))
        finally:
            if timeline is not None:
                timeline.ran(task.exercise.name, started, time.monotonic())

    scheduler = Scheduler(slots, grade_task, recorder.commit, probe=gpus.probe_slot, on_failure=recorder.gpu_failure)
    try:
        with threads.judging(min(len(tasks), sum(s.capacity for s in slots))):
            outcome = scheduler.run(tasks)
    except KeyboardInterrupt:
        with signals_held():  # a second Ctrl-C or a SIGTERM must not cut the stop short
            scheduler.stop()  # first: nothing a killed worker returns is recorded
            processes.kill_active()
        raise
    finally:
        progress.stop()
        recorder.close()
        if load is not None:
            load.stop()
        if timeline is not None:
            timeline.stop()
    if options.profile:
        profiling.report(progress, slots, submissions=len({t.student for t in tasks}), cpu_before=cpu_before,
                         own_before=own_before, load=load, cpu_by_step=recorder.cpu_by_step, timeline=timeline)
    if outcome.left:
        print(f"grader grade: every slot failed ({'; '.join(s.failed or '' for s in slots)}); "
              f"{len(outcome.left)} exercise run(s) left ungraded", file=sys.stderr)
    return outcome.committed, outcome.left


def run_split(ctx: Context, subs: list[submission.Submission], tasks: list[Task], options: config.GradeOptions,
              plan: Plan, shares: list[split.Share], start: float) -> Batch:
    """The tasks graded by a grader process per share (:mod:`grader.grading.batch.split`), then the gradebook and
    the class report from what they committed."""
    where = "; ".join(f"{s.label}: {len(s.students)} submission(s), {s.jobs} run(s) at once" for s in shares)
    progress = Progress(len(tasks), f"{plan.describe(ctx, subs, tasks)}, split over {len(shares)} grader processes "
                        f"({where})", per_submission=len(ctx.selected), work=planned_work(tasks))
    cpu_before = profiling.host_cpu()
    left = split.run(ctx, tasks, shares, secret=plan.secret.value, profile=options.profile,
                     keep_work=options.keep_work, progress=progress)
    elapsed = time.monotonic() - start
    if options.profile:
        print(profiling.split_report(ctx.out, tasks, left, processes=len(shares), wall=progress.wall(),
                                     cpu_before=cpu_before), file=sys.stderr)
    assert plan.title is not None
    return finish(ctx, elapsed, plan.title, len(tasks) - len(left), left,
                  left_reason="the grader process of their share did not grade them: see its lines above")


def finish(ctx: Context, elapsed: float, title: str, done: int, left: list[Task], *,
           left_reason: str = "no usable GPU was left") -> Batch:
    students = rebuild.rebuild(ctx.out, course=ctx.course, all_exercises=ctx.all_exercises)
    batch = Batch(ctx.out, students, ctx.selected, elapsed, store.read_run(ctx.out).get("device", ctx.description),
                  graded=done, left=len(left), left_reason=left_reason if left else "")
    summary(ctx, batch, title)
    return batch
