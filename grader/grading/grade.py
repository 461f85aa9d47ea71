"""``grader grade SUBMISSION... [--out DIR] [options]`` and ``grader grade --regrade-errors OUT``.

Grades every exercise of every submission, each in its own sandboxed worker, and writes the reports
(:mod:`grader.grading.reports`) into the output folder (:mod:`grader.grading.store`) as results come in.
The secret that seeds the hidden cases comes from ``--secret``, else ``$GRADER_SECRET``, else a fresh
random one written to ``OUT/secret.txt`` (keep it to reproduce the run; never give it to students).

A fault of the grader itself makes the part it touched "needs regrade" (never a 0); the command then
exits with status 3 and says how many parts, and ``grader grade --regrade-errors OUT`` runs exactly those
parts again with the same secret and settings.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading import config, isolation, reports, runner, scoring, store, submission
from grader.grading.results import ERROR, NEEDS_REGRADE, ExerciseResult

DEFAULT_OUT = "grading-out"
EXIT_NEEDS_REGRADE = 3


class UsageError(Exception):
    pass


# ------------------------------------------------------------------------------------------ the CLI


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exercises", nargs="+", metavar="NAME",
                        help="grade only these exercises (names or a comma-separated list; default: all)")
    parser.add_argument("--jobs", "-j", type=int, default=None,
                        help="exercise runs at once (default: course.toml; on a GPU, 1 keeps timings fair)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="wall-clock limit per exercise and submission (default: course.toml)")
    parser.add_argument("--call-timeout", type=float, default=None, metavar="S",
                        help="limit for one call of the student's code; the check fails, grading goes on "
                        "(default: course.toml)")
    parser.add_argument("--random", type=int, default=None, metavar="N",
                        help="random cases per part on top of the examples (default: course.toml)")
    parser.add_argument("--memory-mb", type=int, default=None, help="memory limit per worker (default: course.toml)")
    parser.add_argument("--secret", default=None, help="secret seed (default: $GRADER_SECRET, else a random one)")
    parser.add_argument("--course", default=None, metavar="FILE",
                        help="course file laid over grader/grading/course.toml (default: that file alone)")
    parser.add_argument("--keep-work", action="store_true", help="keep the scratch directory (for debugging)")
    parser.add_argument("--profile", action="store_true",
                        help="print where the time went, per exercise (it is always in the reports' details.json)")
    parser.add_argument("--unsandboxed", action="store_true",
                        help="run student code without the bubblewrap sandbox (it then reaches whatever the grader's "
                        "user can); said in run.json and in every report")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("submissions", nargs="*", metavar="SUBMISSION",
                        help="a directory laid out like assignments/, a .zip of one, or a .ipynb")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"report directory (default: {DEFAULT_OUT})")
    parser.add_argument("--regrade-errors", default=None, metavar="OUT",
                        help="run again exactly the parts of OUT that need a regrade (same secret and settings)")
    add_common(parser)


def options_from_args(args: argparse.Namespace) -> config.GradeOptions:
    names = tuple(n.strip() for arg in (args.exercises or ()) for n in arg.split(",") if n.strip())
    return config.GradeOptions(
        exercises=names, jobs=args.jobs, timeout_s=args.timeout, call_timeout_s=args.call_timeout,
        random_cases=args.random, memory_mb=args.memory_mb, secret=args.secret,
        course=Path(args.course) if args.course else None, keep_work=args.keep_work, profile=args.profile,
        unsandboxed=args.unsandboxed,
    )


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    try:
        if args.regrade_errors:
            if args.submissions:
                raise UsageError("--regrade-errors OUT takes no submissions: it regrades what OUT holds")
            batch = regrade_errors(Path(args.regrade_errors), options=options)
        else:
            if not args.submissions:
                raise UsageError("no submissions given (or use --regrade-errors OUT)")
            batch = grade(args.submissions, out=Path(args.out), options=options)
    except (UsageError, config.CourseError) as exc:
        print(f"grader grade: {exc}", file=sys.stderr)
        return 2
    print(f"reports written to {batch.out}", file=sys.stderr)
    return exit_status(batch)


def exit_status(batch: Batch) -> int:
    parts = batch.regrade_parts()
    if not parts:
        return 0
    print(f"grader grade: {len(parts)} part(s) need a regrade because the grader failed on them (not the "
          f"students): {', '.join(parts[:10])}{' ...' if len(parts) > 10 else ''}\n"
          f"  tracebacks: {batch.out / store.STAFF / 'grader-errors.log'}\n"
          f"  regrade them with: grader grade --regrade-errors {batch.out}", file=sys.stderr)
    return EXIT_NEEDS_REGRADE


# ---------------------------------------------------------------------------------------- the batch


@dataclass
class Batch:
    out: Path
    reports: list[reports.StudentReport]
    exercises: tuple[Exercise, ...]
    elapsed_s: float
    device: str

    def regrade_parts(self) -> list[str]:
        return [f"{r.student}: {p}" for r in self.reports for p in r.regrade_parts()]


@dataclass
class _Context:
    """What every exercise run of a batch shares."""

    out: Path
    mode: object  # grader.checks.runtime.Mode
    course: config.Course
    all_exercises: tuple[Exercise, ...]
    selected: tuple[Exercise, ...]
    settings: config.RunSettings
    jobs: int
    device_info: dict
    student_reports: dict[str, reports.StudentReport] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sandbox_note: str = ""  # how every report says where student code ran

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.selected]


def _select(all_exercises: tuple[Exercise, ...], names: tuple[str, ...]) -> tuple[Exercise, ...]:
    if not names:
        return all_exercises
    known = {e.name: e for e in all_exercises}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown exercise(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return tuple(e for e in all_exercises if e.name in names)


def secret_fingerprint(secret: str, salt: str) -> str:
    return hashlib.sha256(f"{salt}\x1f{secret}".encode()).hexdigest()[:16]


def _secret(options: config.GradeOptions, out: Path) -> tuple[str, str]:
    """The secret and where it came from."""
    if options.secret:
        return options.secret, "--secret"
    if os.environ.get("GRADER_SECRET"):
        return os.environ["GRADER_SECRET"], "$GRADER_SECRET"
    secret = secrets.token_hex(16)
    store.write_secret(out, secret)
    return secret, store.SECRET_FILE


def _device_info(mode) -> dict:
    if not mode.is_cuda:
        return {"kind": "cpu"}
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"kind": "cuda", "name": props.name, "index": torch.cuda.current_device(),
            "uuid": str(getattr(props, "uuid", ""))}


def _sandbox(options: config.GradeOptions, out: Path, workdir: Path) -> tuple[isolation.Sandbox | None, str]:
    """The sandbox the workers run in and how the reports say so. Where none can be built, grading is refused
    (UsageError) unless the instructor opted out with --unsandboxed."""
    from grader.checks import runtime

    if options.unsandboxed:
        note = "WITHOUT a sandbox (the instructor passed --unsandboxed)"
        print(f"grader grade: warning: grading {note}: student code reaches whatever this user can", file=sys.stderr)
        return None, note
    protected = [p for p in (out, workdir, isolation.repository_root()) if p is not None]
    found = isolation.check(runtime.configure().device, protected=protected)
    if found.sandbox is None:
        raise UsageError(f"no sandbox for student code can be built here: {found.problem}. Fix that, or pass "
                         "--unsandboxed to grade without one (said in run.json and in every report)")
    return found.sandbox, f"in {found.sandbox.description}"


def _context(out: Path, options: config.GradeOptions, *, secret: str, workdir: Path,
             sandbox: tuple[isolation.Sandbox | None, str] = (None, "")) -> _Context:
    from grader import exercises as registry
    from grader.checks import runtime

    mode = runtime.configure()
    all_ex = registry.all_exercises()
    course = config.load_course(options.course, known=tuple(e.name for e in all_ex))
    selected = _select(all_ex, options.exercises)
    settings = config.resolve(options, course, device=mode.device, secret=secret, workdir=workdir,
                              gpu_name=mode.gpu_name, sandbox=sandbox[0])
    jobs = options.jobs or course.setting("jobs", mode.device)
    if mode.is_cuda and jobs > 1:
        print(f"grader grade: warning: --jobs {jobs} on one GPU makes the workers' timings interfere", file=sys.stderr)
    return _Context(out, mode, course, all_ex, selected, settings, jobs, _device_info(mode), sandbox_note=sandbox[1])


def grade(paths: list[str], *, out: Path, options: config.GradeOptions, title: str = "Grades",
          solutions_id: str | None = None) -> Batch:
    """Grade ``paths`` into ``out``; returns the reports. Usage problems raise UsageError."""
    for path in map(Path, paths):
        if not path.exists():
            raise UsageError(f"{path}: no such file or directory")
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="grader-"))
    os.chmod(workdir, 0o700)
    try:
        sandbox = _sandbox(options, out, workdir)
        secret, secret_source = _secret(options, out)
        ctx = _context(out, options, secret=secret, workdir=workdir, sandbox=sandbox)
        sources = submission.expand([Path(p) for p in paths], ctx.selected)
        if not sources:
            raise UsageError("no submissions to grade")
        for path in sources:
            try:
                submission.kind_of(path)
            except submission.SubmissionError as exc:
                raise UsageError(str(exc)) from None
        start = time.monotonic()
        subs = _prepare(sources, workdir, ctx.selected, solutions_id)
        salt = secrets.token_hex(8)
        store.write_run(out, {
            "device": ctx.mode.description, "gpu": ctx.mode.gpu_name, "exercises": ctx.names,
            "random_cases": ctx.settings.random_cases, "timeout_s": ctx.settings.timeout_s,
            "call_timeout_s": ctx.settings.call_timeout_s, "memory_mb": ctx.settings.memory_mb, "jobs": ctx.jobs,
            "course": ctx.course.source, "course_fingerprint": ctx.course.fingerprint(),
            "correctness": ctx.course.correctness, "submissions": {s.student: str(s.source) for s in subs},
            "secret": secret_source, "secret_salt": salt, "secret_fingerprint": secret_fingerprint(secret, salt),
            "sandbox": ctx.sandbox_note, "unsandboxed": options.unsandboxed,
        })
        for sub in subs:
            ctx.student_reports[sub.student] = reports.StudentReport(
                sub.student, str(sub.source), sub.kind, list(sub.problems), ctx.mode.description,
                sandbox=ctx.sandbox_note)
            store.save_submission(out, sub.student, {"source": str(sub.source.resolve()), "kind": sub.kind,
                                                     "problems": sub.problems, "solutions_id": solutions_id})
        tasks = [(sub, ex, None) for sub in subs for ex in ctx.selected]
        _run_tasks(ctx, tasks, workdir, options,
                   f"grading {len(subs)} submission(s) × {len(ctx.selected)} exercise(s) on {ctx.mode.device}")
        return _finish(ctx, time.monotonic() - start, title, len(subs), len(tasks))
    finally:
        _cleanup(workdir, options.keep_work)


def regrade_errors(out: Path, *, options: config.GradeOptions) -> Batch:
    """Run again exactly the parts of ``out`` that need a regrade, with the run's secret and settings."""
    try:
        recorded = store.read_run(out)
    except (OSError, ValueError):
        raise UsageError(f"{out}: no grading run here (no readable {store.RUN_FILE})") from None
    secret = options.secret or os.environ.get("GRADER_SECRET") or store.read_secret(out)
    if not secret:
        raise UsageError(f"{out}: the run's secret came from {recorded.get('secret')}: give it again "
                         "(--secret or $GRADER_SECRET)")
    if secret_fingerprint(secret, recorded.get("secret_salt", "")) != recorded.get("secret_fingerprint"):
        raise UsageError(f"{out}: that is not the secret this run was graded with (it came from "
                         f"{recorded.get('secret')})")
    options = options.replace(
        exercises=tuple(recorded["exercises"]), random_cases=recorded["random_cases"],
        timeout_s=recorded["timeout_s"], call_timeout_s=recorded["call_timeout_s"],
        memory_mb=recorded["memory_mb"], course=Path(recorded["course"]) if recorded.get("course") else None)
    workdir = Path(tempfile.mkdtemp(prefix="grader-"))
    os.chmod(workdir, 0o700)
    try:
        ctx = _context(out, options, secret=secret, workdir=workdir, sandbox=_sandbox(options, out, workdir))
        if ctx.course.fingerprint() != recorded.get("course_fingerprint"):
            raise UsageError(f"{out}: the course file {ctx.course.source} changed since the run was graded; "
                             "regrade the whole batch instead")
        start = time.monotonic()
        tasks = []
        for i, student in enumerate(store.students(out)):
            previous = store.load_exercises(out, student)
            meta = store.load_submission(out, student)
            report = reports.StudentReport(student, meta["source"], meta["kind"], list(meta["problems"]),
                                           ctx.mode.description, sandbox=ctx.sandbox_note)
            exercises_by_name = {e.name: e for e in ctx.selected}
            for name, result in previous.items():
                if name in exercises_by_name:
                    report.exercises.append((scoring.score_exercise(exercises_by_name[name], result, ctx.course,
                                                                    ctx.all_exercises), result))
            ctx.student_reports[student] = report
            wanted = {name: result for name, result in previous.items() if result.needs_regrade}
            if not wanted:
                continue
            source = Path(meta["source"])
            if not source.exists():
                raise UsageError(f"{student}: the submission {source} is gone; it cannot be regraded")
            sub = submission.prepare(source, workdir / f"sub{i}", ctx.selected)
            sub.student = student
            for name, result in wanted.items():
                tasks.append((sub, exercises_by_name[name], result))
        _run_tasks(ctx, tasks, workdir, options, f"regrading {len(tasks)} exercise run(s) on {ctx.mode.device}")
        return _finish(ctx, time.monotonic() - start, "Regrade", len(ctx.student_reports), len(tasks))
    finally:
        _cleanup(workdir, options.keep_work)


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


def _grade_one(ctx: _Context, sub: submission.Submission, exercise: Exercise, previous: ExerciseResult | None,
               workdir: Path) -> ExerciseResult:
    if not sub.usable:
        return ExerciseResult(exercise.name, exercise.title, ERROR,
                              "the submission could not be read: " + "; ".join(sub.problems))
    parts = tuple(previous.regrade_parts()) if previous is not None else None
    result = runner.grade_exercise(exercise, sub.root, settings=ctx.settings,
                                   scratch=workdir / f"scratch-{sub.student}-{exercise.name}",
                                   cache_dir=workdir / f"triton-cache-{sub.student}", parts=parts,
                                   device_info=ctx.device_info)
    return runner.merge_regrade(previous, result) if previous is not None else result


def _record(ctx: _Context, student: str, exercise: Exercise, result: ExerciseResult) -> None:
    """Commit one exercise's result and rewrite the student's reports and the gradebook."""
    store.save_exercise(ctx.out, student, result)
    store.log_grader_errors(ctx.out, student, result)
    score = scoring.score_exercise(exercise, result, ctx.course, ctx.all_exercises)
    order = {e.name: i for i, e in enumerate(ctx.selected)}
    with ctx.lock:
        report = ctx.student_reports[student]
        report.exercises = [(s, r) for s, r in report.exercises if s.exercise != exercise.name]
        report.exercises.append((score, result))
        report.exercises.sort(key=lambda pair: order.get(pair[0].exercise, 99))
        report.elapsed_s = sum(r.elapsed_s for _, r in report.exercises)
        reports.write_student(ctx.out, report)
        store.write_atomic(ctx.out / store.GRADEBOOK,
                           reports.gradebook_csv(list(ctx.student_reports.values()), ctx.names))


def _run_tasks(ctx: _Context, tasks, workdir: Path, options: config.GradeOptions, description: str) -> None:
    from grader.grading import sandbox

    progress = _Progress(len(tasks), description)
    pool = ThreadPoolExecutor(max_workers=max(1, ctx.jobs))
    try:
        futures = {pool.submit(_grade_one, ctx, sub, ex, prev, workdir): (sub, ex) for sub, ex, prev in tasks}
        for future in as_completed(futures):
            sub, ex = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # _grade_one catches its own; a last resort: still the grader's fault
                from grader.grading.judging import GRADER_FAULT, grader_error

                result = ExerciseResult(ex.name, ex.title, NEEDS_REGRADE, GRADER_FAULT,
                                        grader_errors=[grader_error(ex.name, exc)])
            _record(ctx, sub.student, ex, result)
            progress.advance(f"{sub.student} {ex.name}: {result.status} ({result.elapsed_s:.1f} s)")
            if options.profile:
                progress.note(_profile_text(sub.student, result))
    except KeyboardInterrupt:
        sandbox.kill_active()
        pool.shutdown(wait=False, cancel_futures=True)
        progress.stop()
        print("grader grade: interrupted; the reports hold what was graded so far", file=sys.stderr)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        progress.stop()


def _profile_text(student: str, result: ExerciseResult) -> str:
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in result.profile.items() if k != "total")
    return f"  profile {student} {result.exercise}: {steps}"


def _finish(ctx: _Context, elapsed: float, title: str, n_subs: int, n_tasks: int) -> Batch:
    batch = Batch(ctx.out, list(ctx.student_reports.values()), ctx.selected, elapsed, ctx.mode.description)
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=True, highlight=False, width=160)  # logs: no wrapping of the table
    console.print(reports.summary_table(batch.reports, ctx.names, title=f"{title} ({ctx.mode.description})"))
    console.print(f"graded {n_subs} submission(s), {n_tasks} exercise run(s) in {elapsed:.1f} s "
                  f"({ctx.settings.random_cases} random case(s) per part, {ctx.jobs} job(s))")
    return batch


def _cleanup(workdir: Path, keep: bool) -> None:
    if keep:
        print(f"scratch directory kept: {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


class _Progress:
    """A rich progress bar on a terminal; one plain line per finished task otherwise (logs stay readable)."""

    def __init__(self, total: int, description: str):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.total, self.done = total, 0
        self.bar = None
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=self.console, transient=False)
            self.task = self.bar.add_task(description, total=total)
            self.bar.start()
        else:
            print(description, file=sys.stderr, flush=True)

    def advance(self, message: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.console.log(message)
            self.bar.advance(self.task)
        else:
            print(f"[{self.done}/{self.total}] {message}", file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        if self.bar is not None:
            self.bar.console.log(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
