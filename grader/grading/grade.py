"""``grader grade SUBMISSION... [--out DIR] [options]``, ``grader grade --regrade-errors OUT``, and the same
batch through Slurm (``--slurm``).

A batch is a list of tasks, one per (student, exercise):

1. build the task list from the prepared submissions and the selected exercises;
2. skip what the output folder already holds — a batch grading into a folder that holds one resumes it,
   provided it is the same batch (same secret, course configuration, settings and submission files:
   :mod:`grader.grading.resume` names what differs and refuses);
3. run the tasks on local slots (:mod:`grader.grading.scheduler`: CPU workers, or one worker per GPU with
   ``--gpus``), or as one Slurm job array (:mod:`grader.grading.slurm`) whose tasks come back here
   (:func:`run_array_task`) and grade exactly as a local batch does;
4. commit each result atomically the moment it is judged (:mod:`grader.grading.recorder`);
5. rebuild the gradebook and the class report from the folder (:mod:`grader.grading.rebuild`).

The secret that seeds the hidden cases comes from ``--secret``, else ``$GRADER_SECRET``, else the folder's
``secret.txt``, else a fresh random one written there (mode 600; keep it, never give it to students).

A batch stopped by Ctrl-C or SIGTERM kills its workers and records nothing they return; a SIGKILLed one
is cleaned up by its reaper (:mod:`grader.grading.reaper`). Either way, running the same command again
grades what is left. A fault of the grader itself makes the part it touched "needs regrade" (never a 0);
the command then exits with status 3, and ``grader grade --regrade-errors OUT`` runs those parts again.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading import (
    config,
    gpus,
    markers,
    reaper,
    rebuild,
    reports,
    resume,
    runner,
    sandbox,
    slurm,
    store,
    submission,
)
from grader.grading.progress import Progress
from grader.grading.recorder import Recorder
from grader.grading.results import ERROR, ExerciseResult
from grader.grading.scheduler import Scheduler, Task, estimate, static_estimate
from grader.grading.slots import Slot

DEFAULT_OUT = "grading-out"
EXIT_NEEDS_REGRADE = 3
EXIT_UNFINISHED = 4
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    pass


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop like Ctrl-C."""


# ------------------------------------------------------------------------------------------ the CLI


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exercises", nargs="+", metavar="NAME",
                        help="grade only these exercises (names or a comma-separated list; default: all)")
    parser.add_argument("--jobs", "-j", type=int, default=None,
                        help="exercise runs at once: on a CPU in all, on GPUs per GPU (default: course.toml; a "
                        "speed measurement always holds its GPU alone)")
    parser.add_argument("--gpus", default=None, metavar="all|0,2,3",
                        help="the GPUs to grade on, one worker each (default: the current GPU)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="wall-clock limit per exercise and submission (default: course.toml)")
    parser.add_argument("--call-timeout", type=float, default=None, metavar="S",
                        help="limit for one call of the student's code; the check fails, grading goes on "
                        "(default: course.toml)")
    parser.add_argument("--random", type=int, default=None, metavar="N",
                        help="random cases per part on top of the examples (default: course.toml)")
    parser.add_argument("--memory-mb", type=int, default=None, help="memory limit per worker (default: course.toml)")
    parser.add_argument("--secret", default=None,
                        help="secret seed (default: $GRADER_SECRET, else OUT/secret.txt, else a random one)")
    parser.add_argument("--course", default=None, metavar="FILE",
                        help="course file laid over grader/grading/course.toml (default: that file alone)")
    parser.add_argument("--keep-work", action="store_true", help="keep the scratch directory (for debugging)")
    parser.add_argument("--profile", action="store_true",
                        help="print where the time went, per exercise (it is always in the reports' details.json)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("submissions", nargs="*", metavar="SUBMISSION",
                        help="a directory laid out like assignments/, a .zip of one, or a .ipynb")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"report directory (default: {DEFAULT_OUT}); a batch there is resumed")
    parser.add_argument("--regrade-errors", default=None, metavar="OUT",
                        help="run again exactly the parts of OUT that need a regrade (same secret and settings)")
    parser.add_argument("--fresh", action="store_true",
                        help="discard what --out holds (results, reports, markers; not secret.txt) and grade anew")
    parser.add_argument("--regrade-changed", action="store_true",
                        help="grade from scratch the submissions whose files changed since --out graded them")
    add_common(parser)
    slurm.add_arguments(parser)


def options_from_args(args: argparse.Namespace) -> config.GradeOptions:
    names = tuple(n.strip() for arg in (args.exercises or ()) for n in arg.split(",") if n.strip())
    return config.GradeOptions(
        exercises=names, jobs=args.jobs, timeout_s=args.timeout, call_timeout_s=args.call_timeout,
        random_cases=args.random, memory_mb=args.memory_mb, secret=args.secret,
        course=Path(args.course).resolve() if args.course else None, keep_work=args.keep_work,
        profile=args.profile, gpus=args.gpus, fresh=getattr(args, "fresh", False),
        regrade_changed=getattr(args, "regrade_changed", False), slurm=slurm.overrides(args),
        wait=getattr(args, "wait", False),
    )


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
        if args.regrade_errors:
            if args.submissions:
                raise UsageError("--regrade-errors OUT takes no submissions: it regrades what OUT holds")
            batch = regrade_errors(Path(args.regrade_errors), options=options)
        else:
            if not args.submissions:
                raise UsageError("no submissions given (or use --regrade-errors OUT)")
            batch = grade(args.submissions, out=Path(args.out), options=options)
    except (UsageError, config.CourseError, resume.Conflict, gpus.GpuSelectionError, slurm.SlurmError) as exc:
        print(f"grader grade: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("grader grade: stopped; what was graded is kept: run the same command again to grade the rest",
              file=sys.stderr)
        return 128 + signal.SIGTERM if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    if batch.submitted:
        print(batch.submitted, file=sys.stderr)
        return 0
    print(f"reports written to {batch.out}", file=sys.stderr)
    return exit_status(batch)


def exit_status(batch: Batch) -> int:
    parts = batch.regrade_parts()
    if parts:
        print(f"grader grade: {len(parts)} part(s) need a regrade because the grader failed on them (not the "
              f"students): {', '.join(parts[:10])}{' ...' if len(parts) > 10 else ''}\n"
              f"  tracebacks: {batch.out / store.STAFF / 'grader-errors.log'}\n"
              f"  regrade them with: grader grade --regrade-errors {batch.out}", file=sys.stderr)
        return EXIT_NEEDS_REGRADE
    if batch.left:
        print(f"grader grade: {batch.left} exercise run(s) were not graded ({batch.left_reason}); run the same "
              "command again to grade them", file=sys.stderr)
        return EXIT_UNFINISHED
    return 0


# ---------------------------------------------------------------------------------------- the batch


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
class _Context:
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
                "correctness": self.course.correctness}


class _Workspace:
    """The batch's private scratch directory and token; the reaper that kills its workers and removes the
    directory however this process ends; SIGTERM handled like Ctrl-C."""

    def __init__(self, keep: bool):
        self.keep = keep

    def __enter__(self) -> _Workspace:
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
        sandbox.kill_active()
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


secret_fingerprint = resume.secret_fingerprint


def _secret(options: config.GradeOptions, out: Path) -> tuple[str, str, bool]:
    """The secret, where it came from, and whether it is new (to be written to the folder)."""
    if options.secret:
        return options.secret, "--secret", False
    if os.environ.get("GRADER_SECRET"):
        return os.environ["GRADER_SECRET"], "$GRADER_SECRET", False
    kept = store.read_secret(out)
    if kept:
        return kept, store.SECRET_FILE, False
    return secrets.token_hex(16), store.SECRET_FILE, True


def _context(out: Path, options: config.GradeOptions, *, secret: str, work: _Workspace,
             device: str | None = None) -> _Context:
    """``device``: where the tasks grade, when not here (a Slurm batch submitted from a login node)."""
    from grader import exercises as registry
    from grader.checks import runtime

    mode = runtime.configure()
    device = device or mode.device
    all_ex = registry.all_exercises()
    course = config.load_course(options.course, known=tuple(e.name for e in all_ex))
    selected = _select(all_ex, options.exercises)
    settings = config.resolve(options, course, device=device, secret=secret, workdir=work.dir,
                              gpu_name=mode.gpu_name if device == mode.device else None)
    settings = replace(settings, env={**settings.env, reaper.BATCH_VAR: work.token})
    description = mode.description if device == mode.device else f"{device.upper()} through Slurm"
    return _Context(out, course, all_ex, selected, settings, device, description, work.token, options.course)


def _check_paths(paths: list[str]) -> None:
    for path in map(Path, paths):
        if not path.exists():
            raise UsageError(f"{path}: no such file or directory")


def grade(paths: list[str], *, out: Path, options: config.GradeOptions, title: str = "Grades",
          solutions_id: str | None = None) -> Batch:
    """Grade ``paths`` into ``out`` (resuming the batch there); returns the reports. Usage problems raise
    UsageError, a folder holding another batch resume.Conflict."""
    _check_paths(paths)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with _Workspace(options.keep_work) as work:
        secret, secret_source, new_secret = _secret(options, out)
        slurm_settings = None
        if options.slurm is not None:
            course = config.load_course(options.course)
            slurm_settings = config.slurm_settings(course, options.slurm)
        ctx = _context(out, options, secret=secret, work=work,
                       device=slurm_settings.device if slurm_settings else None)
        sources = submission.expand([Path(p) for p in paths], ctx.selected)
        if not sources:
            raise UsageError("no submissions to grade")
        for path in sources:
            try:
                submission.kind_of(path)
            except submission.SubmissionError as exc:
                raise UsageError(str(exc)) from None
        subs = _prepare(sources, work.dir, ctx.selected, solutions_id)
        _check_idle(out)
        if options.fresh:
            store.clear_results(out)
            if secret_source != store.SECRET_FILE and store.read_secret(out) not in (None, secret):
                (out / store.SECRET_FILE).unlink()  # another batch's secret: it would be mistaken for this one's
        _open_batch(ctx, subs, secret=secret, secret_source=secret_source, new_secret=new_secret, options=options)
        tasks = _pending_tasks(ctx, subs)
        if slurm_settings is not None:
            return _submit(ctx, subs, tasks, secret=secret, settings=slurm_settings, wait=options.wait, start=start)
        description = (f"grading {len(tasks)} exercise run(s) of {len(subs)} submission(s) × {len(ctx.selected)} "
                       f"exercise(s) on {ctx.device}" + _resumed_note(len(subs) * len(ctx.selected), len(tasks)))
        done, left = _run_local(ctx, tasks, work, options, description, students=store.students(out))
        return _finish(ctx, time.monotonic() - start, title, done, left)


def _resumed_note(total: int, pending: int) -> str:
    return f" ({total - pending} already graded in the output folder)" if pending < total else ""


def regrade_errors(out: Path, *, options: config.GradeOptions) -> Batch:
    """Run again exactly the parts of ``out`` that need a regrade, with the run's secret and settings."""
    recorded = _recorded(out)
    secret = options.secret or os.environ.get("GRADER_SECRET") or store.read_secret(out)
    if not secret:
        raise UsageError(f"{out}: the run's secret came from {recorded.get('secret')}: give it again "
                         "(--secret or $GRADER_SECRET)")
    if secret_fingerprint(secret, recorded.get("secret_salt", "")) != recorded.get("secret_fingerprint"):
        raise UsageError(f"{out}: that is not the secret this run was graded with (it came from "
                         f"{recorded.get('secret')})")
    options = _recorded_options(recorded, options)
    start = time.monotonic()
    with _Workspace(options.keep_work) as work:
        ctx = _context(out, options, secret=secret, work=work)
        problems = resume.conflicts(recorded, ctx.identity(), secret)
        if problems:
            raise resume.refuse(out, problems, hint="regrade the whole batch instead (grader grade ... --fresh)")
        _check_idle(out)
        subs = []
        for i, student in enumerate(store.students(out)):
            if not any(r.needs_regrade for r in store.load_exercises(out, student).values()):
                continue
            subs.append(_reprepare(out, student, work.dir / f"sub{i}", ctx.selected))
        tasks = [t for t in _pending_tasks(ctx, subs) if t.previous is not None]
        done, left = _run_local(ctx, tasks, work, options, f"regrading {len(tasks)} exercise run(s) on {ctx.device}",
                                students=store.students(out))
        return _finish(ctx, time.monotonic() - start, "Regrade", done, left)


def _recorded(out: Path) -> dict:
    try:
        return store.read_run(out)
    except (OSError, ValueError):
        raise UsageError(f"{out}: no grading run here (no readable {store.RUN_FILE})") from None


def _recorded_options(recorded: dict, options: config.GradeOptions) -> config.GradeOptions:
    """The options that decide scores, as the batch recorded them."""
    course = recorded.get("course_file") or recorded.get("course")
    return options.replace(
        exercises=tuple(recorded["exercises"]), random_cases=recorded["random_cases"],
        timeout_s=recorded["timeout_s"], call_timeout_s=recorded["call_timeout_s"],
        memory_mb=recorded["memory_mb"], course=Path(course) if course else None)


def _reprepare(out: Path, student: str, dest: Path, selected: tuple[Exercise, ...]) -> submission.Submission:
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


def _prepare(sources: list[Path], workdir: Path, selected, solutions_id: str | None) -> list[submission.Submission]:
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


def _check_idle(out: Path) -> None:
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


def _open_batch(ctx: _Context, subs: list[submission.Submission], *, secret: str, secret_source: str,
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
        current.update(secret=secret_source, secret_salt=salt, secret_fingerprint=secret_fingerprint(secret, salt))
    store.write_run(out, resume.merged_record(recorded, current, [e.name for e in ctx.all_exercises]))
    for sub in subs:
        store.save_submission(out, sub.student, {
            "source": str(sub.source.resolve()), "kind": sub.kind, "problems": sub.problems,
            "content_hash": hashes[sub.student], "display_name": sub.display_name})


def _pending_tasks(ctx: _Context, subs: list[submission.Submission]) -> list[Task]:
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


def local_slots(ctx: _Context, options: config.GradeOptions, *, available=None, current=None) -> list[Slot]:
    """CPU worker places (``--jobs``), or the chosen GPUs (``--gpus``) with ``--jobs`` runs each."""
    jobs = options.jobs or ctx.course.setting("jobs", ctx.device)
    if ctx.device != "cuda":
        return gpus.cpu_slots(jobs)
    available = gpus.visible() if available is None else available
    current = gpus.current_index() if current is None else current
    return gpus.gpu_slots(options.gpus, jobs, available=available, current=current)


def _grade_task(ctx: _Context, work: _Workspace, recorder: Recorder, task: Task, slot: Slot) -> ExerciseResult:
    recorder.started(task, slot)
    sub, exercise = task.submission, task.exercise
    if not sub.usable:
        return ExerciseResult(exercise.name, exercise.title, ERROR,
                              "the submission could not be read: " + "; ".join(sub.problems), device=dict(slot.device))
    parts = tuple(task.previous.regrade_parts()) if task.previous is not None else None
    result = runner.grade_exercise(exercise, sub.root, settings=ctx.settings,
                                   scratch=work.dir / f"scratch-{sub.student}-{exercise.name}",
                                   cache_dir=work.dir / f"triton-cache-{sub.student}", parts=parts, slot=slot)
    if task.previous is None or set(parts or ()) >= {p.name for p in exercise.parts}:
        return result  # graded whole: nothing of the previous run is kept
    return runner.merge_regrade(task.previous, result)


def _run_local(ctx: _Context, tasks: list[Task], work: _Workspace, options: config.GradeOptions, description: str,
               *, students: list[str], gradebook: bool = True) -> tuple[int, list[Task]]:
    """Run ``tasks`` on this machine's slots, committing each result; (committed, left ungraded)."""
    slots = local_slots(ctx, options)
    run = store.read_run(ctx.out)
    progress = Progress(len(tasks), f"{description} ({', '.join(s.describe() for s in slots)})")
    recorder = Recorder(ctx.out, course=ctx.course, all_exercises=ctx.all_exercises, names=run["exercises"],
                        device=run.get("device", ctx.description), students=students, batch=ctx.batch,
                        gradebook=gradebook, progress=progress, profile=options.profile)
    scheduler = Scheduler(slots, lambda task, slot: _grade_task(ctx, work, recorder, task, slot), recorder.commit,
                          probe=gpus.probe_slot, on_failure=recorder.gpu_failure)
    try:
        outcome = scheduler.run(tasks)
    except KeyboardInterrupt:
        scheduler.stop()  # first: nothing a killed worker returns is recorded
        sandbox.kill_active()
        raise
    finally:
        progress.stop()
        recorder.close()
    if outcome.left:
        print(f"grader grade: every slot failed ({'; '.join(s.failed or '' for s in slots)}); "
              f"{len(outcome.left)} exercise run(s) left ungraded", file=sys.stderr)
    return outcome.committed, outcome.left


def _finish(ctx: _Context, elapsed: float, title: str, done: int, left: list[Task]) -> Batch:
    students = rebuild.rebuild(ctx.out, course=ctx.course, all_exercises=ctx.all_exercises)
    batch = Batch(ctx.out, students, ctx.selected, elapsed, store.read_run(ctx.out).get("device", ctx.description),
                  graded=done, left=len(left), left_reason="no usable GPU was left" if left else "")
    _summary(ctx, batch, title)
    return batch


def _summary(ctx: _Context, batch: Batch, title: str) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=True, highlight=False, width=160)  # logs: no wrapping of the table
    names = list(store.read_run(ctx.out)["exercises"])
    console.print(reports.summary_table(batch.reports, names, title=f"{title} ({batch.device})"))
    console.print(f"graded {batch.graded} exercise run(s) in {batch.elapsed_s:.1f} s ({ctx.settings.random_cases} "
                  f"random case(s) per part); class report: {ctx.out / store.CLASS_REPORT_HTML}")


# ------------------------------------------------------------------------------------------ Slurm


def _submit(ctx: _Context, subs: list[submission.Submission], tasks: list[Task], *, secret: str,
            settings: config.SlurmSettings, wait: bool, start: float) -> Batch:
    if store.read_secret(ctx.out) != secret:
        store.write_secret(ctx.out, secret)  # the tasks read it there (mode 600), never from the job's command
    if not tasks:
        print("grader grade: every exercise run is graded already; rebuilding the reports", file=sys.stderr)
        return _finish(ctx, time.monotonic() - start, "Grades", 0, [])
    jobs = slurm.submit(ctx.out, tasks, settings=settings, secret=secret)
    note = (f"submitted {len(tasks)} exercise run(s) of {len({t.student for t in tasks})} submission(s) as Slurm job "
            f"array {jobs.array_job} and merge job {jobs.merge_job}; follow with: grader status {ctx.out}")
    if not wait:
        return Batch(ctx.out, [], ctx.selected, time.monotonic() - start, ctx.description, submitted=note)
    print(note, file=sys.stderr)
    try:
        slurm.wait(ctx.out, jobs)
    except KeyboardInterrupt:
        print(f"grader grade: no longer waiting; the jobs go on (scancel {jobs.array_job} {jobs.merge_job} to "
              "stop them)", file=sys.stderr)
        raise
    students = rebuild.all_reports(ctx.out, course=ctx.course, all_exercises=ctx.all_exercises)
    left = sum(1 for t in tasks if t.exercise.name not in store.committed(ctx.out, t.student))
    batch = Batch(ctx.out, students, ctx.selected, time.monotonic() - start, ctx.description,
                  graded=len(tasks) - left, left=left,
                  left_reason=f"their Slurm tasks ended without a result: see grader status {ctx.out}")
    _summary(ctx, batch, "Grades (Slurm)")
    return batch


def run_array_task(out: Path, tasks_file: Path, index: int) -> int:
    """One Slurm array task: grade one submission's unfinished exercises into ``out``, exactly as a local
    batch would (the secret from ``out``'s mode-600 file, the settings from run.json)."""
    out = out.resolve()
    recorded = _recorded(out)
    entry = json.loads(tasks_file.read_text())["students"][index]
    secret = store.read_secret(out)
    if not secret or secret_fingerprint(secret, recorded.get("secret_salt", "")) != recorded.get("secret_fingerprint"):
        print(f"grader grade-task: {out / store.SECRET_FILE} is missing or is not the batch's secret", file=sys.stderr)
        return 2
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    options = _recorded_options(recorded, config.GradeOptions(jobs=int(cpus) if cpus and cpus.isdigit() else None,
                                                              gpus="all"))
    with _Workspace(False) as work:
        ctx = _context(out, options, secret=secret, work=work)
        problems = resume.conflicts(recorded, ctx.identity(), secret)
        if problems:
            print(str(resume.refuse(out, problems, hint="")), file=sys.stderr)
            return 2
        sub = _reprepare(out, entry["student"], work.dir / "sub", ctx.selected)
        tasks = _pending_tasks(ctx, [sub])
        _, left = _run_local(ctx, tasks, work, options, f"grading {sub.student} (Slurm task {index})",
                             students=[sub.student], gradebook=False)
    results = store.load_exercises(out, sub.student)
    if left:
        return EXIT_UNFINISHED
    return EXIT_NEEDS_REGRADE if any(r.needs_regrade for r in results.values()) else 0


def merge(out: Path, batch_number: int) -> int:
    """The Slurm batch's last job: the gradebook and the class report, from what the tasks committed."""
    from grader import exercises as registry

    out = out.resolve()
    recorded = _recorded(out)
    course = config.load_course(_recorded_options(recorded, config.GradeOptions()).course)
    students = rebuild.rebuild(out, course=course, all_exercises=registry.all_exercises())
    slurm.mark_merged(out, batch_number, {"students": len(students), "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    print(f"merged {len(students)} student(s) into {out / store.GRADEBOOK} and {out / store.CLASS_REPORT_HTML}",
          file=sys.stderr)
    return 0

