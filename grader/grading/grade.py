"""``grader grade SUBMISSION... [--out DIR] [--exercises ...] [--jobs N] [--timeout S] [--random N]``

Grades every exercise of every submission, each in its own sandboxed worker process, and writes the
reports (see :mod:`grader.grading.reports`) to ``--out`` as results come in. The secret that seeds
the hidden cases comes from ``--secret``, else ``$GRADER_SECRET``, else a fresh random one that is
written to ``OUT/secret.txt`` (keep it to reproduce the run; never give it to students).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from grader.spec import Exercise

DEFAULT_OUT = "grading-out"


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exercises", nargs="+", metavar="NAME",
                        help="grade only these exercises (names or a comma-separated list; default: all)")
    parser.add_argument("--jobs", "-j", type=int, default=None,
                        help="workers running at once (default: 1 on a GPU, so timings are fair; 2 on CPU)")
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
                        help="course file (default: grader/grading/course.toml)")
    parser.add_argument("--keep-work", action="store_true", help="keep the scratch directory (for debugging)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("submissions", nargs="+", metavar="SUBMISSION",
                        help="a directory laid out like assignments/, a .zip of one, or a .ipynb")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"report directory (default: {DEFAULT_OUT})")
    add_common(parser)


def run(args: argparse.Namespace) -> int:
    try:
        batch = grade(args.submissions, out=Path(args.out), options=args)
    except UsageError as exc:
        print(f"grader grade: {exc}", file=sys.stderr)
        return 2
    print(f"reports written to {batch.out}", file=sys.stderr)
    return 0


class UsageError(Exception):
    pass


@dataclass
class Batch:
    out: Path
    reports: list  # list[StudentReport]
    exercises: tuple[Exercise, ...]
    elapsed_s: float
    device: str


def _select(all_exercises: tuple[Exercise, ...], names: list[str] | None) -> tuple[Exercise, ...]:
    if not names:
        return all_exercises
    wanted = [n.strip() for arg in names for n in arg.split(",") if n.strip()]
    known = {e.name: e for e in all_exercises}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UsageError(f"unknown exercise(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return tuple(e for e in all_exercises if e.name in wanted)


def _secret(options, out: Path) -> str:
    secret = getattr(options, "secret", None) or os.environ.get("GRADER_SECRET")
    if secret:
        return secret
    secret = secrets.token_hex(16)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "secret.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def grade(
    paths: list[str],
    *,
    out: Path,
    options: argparse.Namespace,
    title: str = "Grades",
    solutions_id: str | None = None,
) -> Batch:
    """Grade ``paths`` into ``out``; returns the reports. Usage problems raise UsageError."""
    from grader import exercises as registry
    from grader import runtime
    from grader.grading import reports, runner, sandbox, scoring, submission

    mode = runtime.configure()
    device = mode.device
    all_ex = registry.all_exercises()
    try:
        course = scoring.load_course(getattr(options, "course", None), known=tuple(e.name for e in all_ex))
    except scoring.CourseError as exc:
        raise UsageError(str(exc)) from None
    selected = _select(all_ex, getattr(options, "exercises", None))
    for path in map(Path, paths):
        if not path.exists():
            raise UsageError(f"{path}: no such file or directory")
    sources = submission.expand([Path(p) for p in paths], selected)
    if not sources:
        raise UsageError("no submissions to grade")
    for path in sources:
        try:
            submission.kind_of(path)
        except submission.SubmissionError as exc:
            raise UsageError(str(exc)) from None

    out.mkdir(parents=True, exist_ok=True)
    n_random = options.random if getattr(options, "random", None) is not None else int(
        course.setting("random_cases", device, 3 if device == "cpu" else 30))
    timeout = options.timeout or float(course.setting("timeout_s", device, 600))
    call_timeout = getattr(options, "call_timeout", None) or float(course.setting("call_timeout_s", device, 120))
    memory_mb = options.memory_mb or int(course.setting("memory_mb", device, 16384))
    jobs = options.jobs or (1 if device == "cuda" else min(2, os.cpu_count() or 1))
    gpu_name = None
    if device == "cuda":
        import torch

        gpu_name = torch.cuda.get_device_name()
        if jobs > 1:
            print(f"grader grade: warning: --jobs {jobs} on a GPU makes the workers' timings interfere",
                  file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="grader-"))
    os.chmod(workdir, 0o700)
    settings = runner.Settings(device=device, secret=_secret(options, out), n_random=n_random, timeout_s=timeout,
                               memory_mb=memory_mb, workdir=workdir, gpu_name=gpu_name,
                               call_timeout_s=min(call_timeout, timeout),
                               speed_budget_s=float(course.setting("speed_budget_s", device, 10.0)))

    start = time.monotonic()
    subs = []
    used: set[str] = set()
    for i, path in enumerate(sources):
        sub = submission.prepare(path, workdir / f"sub{i}", selected)
        if solutions_id:
            sub.student = solutions_id
        base, n = sub.student, 2
        while sub.student in used:
            sub.student, n = f"{base}-{n}", n + 1
        used.add(sub.student)
        subs.append(sub)

    student_reports = {
        sub.student: reports.StudentReport(sub.student, str(sub.source), sub.kind, list(sub.problems),
                                           mode.description)
        for sub in subs
    }
    names = [e.name for e in selected]
    (out / "run.json").write_text(json.dumps({
        "device": mode.description, "gpu": gpu_name, "exercises": names, "random_cases": n_random,
        "timeout_s": timeout, "call_timeout_s": settings.call_timeout_s, "memory_mb": memory_mb, "jobs": jobs,
        "course": course.source,
        "correctness": course.correctness, "submissions": {s.student: str(s.source) for s in subs},
        "secret": "from --secret/$GRADER_SECRET" if (getattr(options, "secret", None)
                                                      or os.environ.get("GRADER_SECRET")) else "secret.txt",
    }, indent=2) + "\n")
    lock = threading.Lock()
    order = {e.name: i for i, e in enumerate(selected)}

    def grade_one(sub, exercise: Exercise):
        if not sub.usable:
            return runner.ExerciseResult(exercise.name, exercise.title, "error",
                                         "the submission could not be read: " + "; ".join(sub.problems))
        return runner.grade_exercise(exercise, sub.root, settings, workdir / f"scratch-{sub.student}-{exercise.name}",
                                     cache_dir=workdir / f"triton-cache-{sub.student}")

    def record(sub, exercise: Exercise, result) -> None:
        score = scoring.score_exercise(exercise, result, course, all_ex)
        with lock:
            report = student_reports[sub.student]
            report.exercises.append((score, result))
            report.exercises.sort(key=lambda pair: order[pair[0].exercise])
            report.elapsed_s = sum(r.elapsed_s for _, r in report.exercises)
            reports.write_student(out, report)
            reports.write_atomic(out / "grades.csv", reports.gradebook_csv(list(student_reports.values()), names))

    tasks = [(sub, ex) for sub in subs for ex in selected]
    progress = _Progress(len(tasks), f"grading {len(subs)} submission(s) × {len(selected)} exercise(s) on {device}")
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = {pool.submit(grade_one, sub, ex): (sub, ex) for sub, ex in tasks}
        for future in as_completed(futures):
            sub, ex = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # grade_exercise catches its own; this is a last resort
                result = runner.ExerciseResult(ex.name, ex.title, "error", f"internal grader error: {exc!r}")
            record(sub, ex, result)
            progress.advance(f"{sub.student} {ex.name}: {result.status} ({result.elapsed_s:.1f} s)")
    except KeyboardInterrupt:
        sandbox.kill_active()
        pool.shutdown(wait=False, cancel_futures=True)
        progress.stop()
        print("grader grade: interrupted; the reports hold what was graded so far", file=sys.stderr)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        progress.stop()
        if not getattr(options, "keep_work", False):
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"scratch directory kept: {workdir}", file=sys.stderr)
    elapsed = time.monotonic() - start
    batch = Batch(out, list(student_reports.values()), selected, elapsed, mode.description)
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=True, highlight=False, width=160)  # logs: no wrapping of the table
    console.print(reports.summary_table(batch.reports, names, title=f"{title} ({mode.description})"))
    console.print(f"graded {len(subs)} submission(s), {len(tasks)} exercise run(s) in {elapsed:.1f} s "
                  f"({n_random} random case(s) per part, {jobs} job(s))")
    return batch


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

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

