"""``grader grade SUBMISSION... [--out DIR] [options]``, ``grader grade --regrade-errors OUT``, and the same
batch through Slurm (``--slurm``).

A batch is a list of tasks, one per (student, exercise) (:mod:`grader.grading.batch.pipeline`):

1. build the task list from the prepared submissions and the selected exercises;
2. skip what the output folder already holds — a batch grading into a folder that holds one resumes it,
   provided it is the same batch (same secret, course configuration, settings and submission files:
   :mod:`grader.grading.batch.resume` names what differs and refuses);
3. run the tasks on local slots (:mod:`grader.grading.batch.scheduler`: CPU workers, or the GPUs of ``--gpus``,
   several runs sharing each; with several GPUs, one grader process per GPU: :mod:`grader.grading.batch.split`), or
   as one Slurm job array (:mod:`grader.grading.batch.slurm`) whose tasks grade exactly as a local
   batch does (:mod:`grader.grading.commands.grade_task`);
4. commit each result atomically the moment it is judged (:mod:`grader.grading.batch.result_commits`);
5. rebuild the gradebook and the class report from the folder (:mod:`grader.grading.results.rebuild`).

The secret that seeds the hidden cases comes from ``--secret``, else ``$GRADER_SECRET``, else the folder's
``secret.txt``, else a fresh random one written there (mode 600; keep it, never give it to students).

A batch stopped by Ctrl-C or SIGTERM kills its workers and records nothing they return; a SIGKILLed one
is cleaned up by its reaper (:mod:`grader.grading.isolation.reaper`). Either way, running the same command again
grades what is left. A fault of the grader itself makes the part it touched "needs regrade" (never a 0);
the command then exits with status 3, and ``grader grade --regrade-errors OUT`` runs those parts again.
Exit statuses: 0 all graded; 2 a usage error; 3 parts need a regrade; 4 runs were left ungraded (run the same
command again); 5 a submission could not be read or held no exercise module (each is named with its reason).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from grader.grading import config
from grader.grading.batch import exits, gpus, resume, slurm, submission
from grader.grading.batch import pipeline as batch_mod
from grader.grading.batch.batch_secret import batch_secret
from grader.grading.batch.context import Terminated, UsageError, select_exercises
from grader.grading.batch.pipeline import Batch
from grader.grading.batch.scheduler import Task
from grader.grading.results import rebuild, store

DEFAULT_OUT = "grading-out"
EXIT_NEEDS_REGRADE = exits.NEEDS_REGRADE
EXIT_UNFINISHED = exits.UNFINISHED
EXIT_UNGRADABLE = exits.UNGRADABLE
EXIT_INTERRUPTED = 130


# ------------------------------------------------------------------------------------------ the CLI


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exercises", nargs="+", metavar="NAME",
                        help="grade only these exercises (names or a comma-separated list; default: all)")
    parser.add_argument("--jobs", "-j", type=int, default=None,
                        help="exercise runs at once: on a CPU in all, on GPUs per GPU (default: course.toml; on "
                        "GPUs, chosen from each GPU's memory and the host's cores; timed work always holds its GPU "
                        "alone)")
    parser.add_argument("--gpus", default=None, metavar="all|0,2,3",
                        help="the GPUs to grade on (default: the current GPU)")
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
    parser.add_argument("--yardstick", action=argparse.BooleanOptionalAction, default=None,
                        help="on a GPU, time the reference solutions (solutions/) beside every submission, in the same "
                        "rounds, and credit speed from that ratio: no thresholds file needed (docs/trusted-timer.md). "
                        "Default: on where solutions/ is present; --no-yardstick credits speed against the GPU's "
                        "thresholds file")
    parser.add_argument("--unsandboxed", action="store_true",
                        help="run student code without the bubblewrap sandbox (it then reaches whatever the grader's "
                        "user can); said in run.json and in every report")


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
    parser.add_argument("--processes", type=int, default=None, metavar="N",
                        help="grader processes to split the batch over, each grading its share of the students: on "
                        "GPUs one per GPU (the default) or 1; on a CPU N, sharing --jobs (default: 1)")
    slurm.add_arguments(parser)


def options_from_args(args: argparse.Namespace) -> config.GradeOptions:
    names = tuple(n.strip() for arg in (args.exercises or ()) for n in arg.split(",") if n.strip())
    return config.GradeOptions(
        exercises=names, jobs=args.jobs, timeout_s=args.timeout, call_timeout_s=args.call_timeout,
        random_cases=args.random, memory_mb=args.memory_mb, secret=args.secret,
        course=Path(args.course).resolve() if args.course else None, keep_work=args.keep_work,
        profile=args.profile, gpus=args.gpus, processes=getattr(args, "processes", None),
        fresh=getattr(args, "fresh", False),
        regrade_changed=getattr(args, "regrade_changed", False), slurm=slurm.overrides(args),
        wait=getattr(args, "wait", False),
        unsandboxed=args.unsandboxed, yardstick=getattr(args, "yardstick", None),
    )


def run(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
        if options.yardstick is True and not config.default_solutions().is_dir():
            raise UsageError(f"--yardstick times the reference solutions, and {config.default_solutions()} is not a "
                             "folder: run the grader from a checkout of the course repository")
        if options.processes is not None and options.slurm is not None:
            raise UsageError("--processes splits a batch graded here; with --slurm each array task grades one "
                             "submission")
        if args.regrade_errors:
            if args.submissions:
                raise UsageError("--regrade-errors OUT takes no submissions: it regrades what OUT holds")
            batch = regrade_errors(Path(args.regrade_errors), options=options)
        else:
            if not args.submissions:
                raise UsageError("no submissions given (or use --regrade-errors OUT)")
            if config.load_course(options.course).cases_seed == config.DEFAULT_CASES_SEED:
                print("grader grade: warning: the course file's cases_seed is the public default, so anyone with this "
                      "repository can draw the hidden cases: set a private one in your course file (--course)",
                      file=sys.stderr)
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
    ungradable = [r.student for r in batch.reports if r.ungradable]
    if ungradable:
        print(f"grader grade: {len(ungradable)} submission(s) had nothing that could be graded (named above): "
              f"{', '.join(ungradable[:10])}{' ...' if len(ungradable) > 10 else ''}", file=sys.stderr)
        return EXIT_UNGRADABLE
    return 0


# ---------------------------------------------------------------------------------------- the batch


def grade(paths: list[str], *, out: Path, options: config.GradeOptions, title: str = "Grades",
          solutions_id: str | None = None) -> Batch:
    """Grade ``paths`` into ``out`` (resuming the batch there); returns the reports. Usage problems raise
    UsageError, a folder holding another batch resume.Conflict."""
    batch_mod.check_paths(paths)
    select_exercises(options.exercises)  # a usage error leaves no output folder behind
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _grade(paths, out=out, options=options, title=title, solutions_id=solutions_id)
    except (UsageError, config.CourseError):
        if made and not any(out.iterdir()):  # refused before anything was recorded: no empty folder stays
            out.rmdir()
        raise


def _grade(paths: list[str], *, out: Path, options: config.GradeOptions, title: str,
           solutions_id: str | None) -> Batch:
    secret = batch_secret(options, out)
    settings = None if options.slurm is None else config.slurm_settings(config.load_course(options.course),
                                                                        options.slurm)

    def prepare(ctx: batch_mod.Context, workdir: Path) -> list[submission.Submission]:
        sources = submission.expand([Path(p) for p in paths], ctx.selected)
        if not sources:
            raise UsageError("no submissions to grade")
        for path in sources:
            try:
                submission.kind_of(path)
            except submission.SubmissionError as exc:
                raise UsageError(str(exc)) from None
        return batch_mod.prepare_all(sources, workdir, ctx.selected, solutions_id)

    def describe(ctx: batch_mod.Context, subs: list[submission.Submission], tasks: list[Task]) -> str:
        return (f"grading {len(tasks)} exercise run(s) of {len(subs)} submission(s) × {len(ctx.selected)} "
                f"exercise(s) on {ctx.device}" + _resumed_note(len(subs) * len(ctx.selected), len(tasks)))

    def submit(ctx: batch_mod.Context, tasks: list[Task], start: float) -> Batch:
        assert settings is not None
        return _submit(ctx, tasks, secret=secret.value, settings=settings, wait=options.wait, start=start)

    return batch_mod.run_batch(out, batch_mod.Plan(
        options, secret, prepare, describe, title, device=settings.device if settings else None,
        elsewhere=submit if settings else None))


def _resumed_note(total: int, pending: int) -> str:
    return f" ({total - pending} already graded in the output folder)" if pending < total else ""


def regrade_errors(out: Path, *, options: config.GradeOptions) -> Batch:
    """Run again exactly the parts of ``out`` that need a regrade, with the run's secret and settings."""
    recorded = batch_mod.recorded_run(out)
    secret = batch_secret(options, out, recorded)
    options = batch_mod.recorded_options(recorded, options)

    def prepare(ctx: batch_mod.Context, workdir: Path) -> list[submission.Submission]:
        """The students with a part that needs a regrade, their submissions prepared again."""
        return [batch_mod.reprepare(out, student, workdir / f"sub{i}", ctx.selected)
                for i, student in enumerate(store.students(out))
                if any(r.needs_regrade for r in store.load_exercises(out, student).values())]

    return batch_mod.run_batch(out, batch_mod.Plan(
        options, secret, prepare, lambda ctx, subs, tasks: f"regrading {len(tasks)} exercise run(s) on {ctx.device}",
        "Regrade", joins=recorded, hint="regrade the whole batch instead (grader grade ... --fresh)",
        only_previous=True))


# ------------------------------------------------------------------------------------------ Slurm


def _submit(ctx: batch_mod.Context, tasks: list[Task], *, secret: str, settings: config.SlurmSettings, wait: bool,
            start: float) -> Batch:
    if store.read_secret(ctx.out) != secret:
        store.write_secret(ctx.out, secret)  # the tasks read it there (mode 600), never from the job's command
    if not tasks:
        print("grader grade: every exercise run is graded already; rebuilding the reports", file=sys.stderr)
        return batch_mod.finish(ctx, time.monotonic() - start, "Grades", 0, [])
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
    batch_mod.summary(ctx, batch, "Grades (Slurm)")
    return batch
