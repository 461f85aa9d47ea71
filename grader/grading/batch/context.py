"""What every exercise run of a batch shares (:class:`Context`: course, settings, sandbox) and the :class:`Workspace`
the batch runs in: its private scratch directory and token, and the reaper (:mod:`grader.grading.isolation.reaper`)
that kills its workers and removes the directory however the process ends; SIGTERM stops the batch like Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading import config
from grader.grading.exercise_run import references, yardstick_plans
from grader.grading.isolation import bwrap, processes, reaper
from grader.grading.results import store


class UsageError(Exception):
    pass


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop like Ctrl-C."""


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
                "unsandboxed": self.unsandboxed, "yardstick": s.yardstick is not None}


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


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM ignored while the block runs: a stop under way (its workers, its children) is not cut
    short by a second Ctrl-C. In the main thread only (elsewhere they never arrive)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, and not restorable from here
                signal.signal(signum, handler)


def select_exercises(names: tuple[str, ...]) -> tuple[Exercise, ...]:
    """The exercises ``--exercises`` names (all where it names none); UsageError naming the unknown ones."""
    from grader import exercises as registry

    return _select(registry.all_exercises(), names)


def _select(all_exercises: tuple[Exercise, ...], names: tuple[str, ...]) -> tuple[Exercise, ...]:
    if not names:
        return all_exercises
    known = {e.name: e for e in all_exercises}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown exercise(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return tuple(e for e in all_exercises if e.name in names)


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
    box, note = sandbox
    if box is not None and box.scratch_bytes:  # the course's size of a worker's /tmp (this bwrap can size it)
        box = replace(box, scratch_bytes=int(course.setting("scratch_mb", device)) << 20)
        note = f"in {box.description}"
    sandbox = (box, note)
    settings = config.resolve(options, course, device=device, secret=secret, workdir=work.dir,
                              gpu_name=mode.gpu_name if device == mode.device else None, sandbox=sandbox[0])
    settings = replace(settings, env={**settings.env, reaper.BATCH_VAR: work.token},
                       references=references.ReferenceStore(options.references or out / store.REFERENCES, secret),
                       yardstick_cache=options.yardstick_cache or yardstick_plans.default_cache())
    description = mode.description if device == mode.device else f"{device.upper()} through Slurm"
    return Context(out, course, all_ex, selected, settings, device, description, work.token, options.course,
                   sandbox_note=sandbox[1], unsandboxed=options.unsandboxed)

