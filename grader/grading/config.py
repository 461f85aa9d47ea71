"""Configuration, typed: the course (``course.toml``), the options of one ``grader grade`` run, and the
settings an exercise run gets once both are resolved for a device.

Every default lives in ``grader/grading/course.toml``; an instructor's ``--course FILE`` is laid over it
key by key, and command-line options over both. Nothing else in the grader holds a default number.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grader.checks.spec import Exercise
from grader.speed.thresholds.calibrated import ThresholdsError
from grader.speed.thresholds.speed_curves import Curve, curve_for, curves_from_table

if TYPE_CHECKING:  # types only: the settings sit below every wing of grader.grading, which all read them
    from grader.grading.exercise_run.references import ReferenceStore
    from grader.grading.isolation.bwrap import Sandbox

COURSE_FILE = Path(__file__).with_name("course.toml")
CORRECTNESS_MODES = ("fraction", "all-or-nothing")
DEVICES = ("cpu", "cuda")
# [grading] keys that may differ per device (``key_cpu`` / ``key_cuda``), with their type
DEFAULT_CASES_SEED = "triton-kernels-course"  # course.toml's public default: instructors set their own
PER_DEVICE = {"random_cases": int, "timeout_s": float, "call_timeout_s": float, "memory_mb": int,
              "speed_budget_s": float, "jobs": int, "compile_timeout_s": float, "scratch_mb": int}


class CourseError(ValueError):
    """The course file is not usable (told to the instructor verbatim)."""


@dataclass(frozen=True)
class Course:
    name: str
    total: float
    weights: Mapping[str, float]
    correctness: str
    grading: Mapping[str, Any]  # the [grading] table as read (per-device keys resolved by setting())
    source: str
    slurm: Mapping[str, Any] = field(default_factory=dict)  # the [slurm] table: where a batch runs, not how it scores
    speed_curves: Mapping[str, Curve] = field(default_factory=dict)  # "<exercise>" or "<exercise>.<part>" -> curve

    def curve(self, exercise: str, part: str) -> Curve | None:
        """The speed curve the course sets for a part (its own, else its exercise's), or None: the thresholds'."""
        return curve_for(self.speed_curves, exercise, part)

    def weight(self, exercise: str) -> float:
        return float(self.weights.get(exercise, 1.0))

    def setting(self, key: str, device: str) -> Any:
        value = self.grading.get(f"{key}_{device}", self.grading.get(key))
        if value is None:
            raise CourseError(f"{self.source}: [grading] has no {key} (nor {key}_{device})")
        return PER_DEVICE[key](value)

    @property
    def cases_seed(self) -> str:
        """The seed of every case of every batch of the course ("": each batch's secret draws them)."""
        return str(self.grading.get("cases_seed", ""))

    def scale(self, exercises: Iterable[Exercise]) -> float:
        """Course points per declared point (before the exercise's weight)."""
        weighted = sum(self.weight(e.name) * e.max_points for e in exercises)
        return self.total / weighted if weighted > 0 else 0.0

    def factor(self, exercise: Exercise, exercises: Iterable[Exercise]) -> float:
        """Course points per point declared by ``exercise``."""
        return self.scale(exercises) * self.weight(exercise.name)

    def decisions(self) -> dict[str, Any]:
        """What the course file decides about scores (weights, totals, modes, limits), as plain data."""
        return {"name": self.name, "total": self.total, "weights": dict(self.weights),
                "correctness": self.correctness, "grading": dict(self.grading),
                "speed_curve": {k: vars(c) for k, c in self.speed_curves.items()}}

    def fingerprint(self) -> str:
        """A digest of :meth:`decisions`."""
        return hashlib.sha256(json.dumps(self.decisions(), sort_keys=True).encode()).hexdigest()[:16]


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CourseError(f"{path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise CourseError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _speed_curves(table: Mapping[str, Any], source: str) -> dict[str, Curve]:
    try:
        return curves_from_table(table, source)
    except ThresholdsError as exc:
        raise CourseError(str(exc)) from None


def _known_grading_key(key: str) -> bool:
    if key in ("correctness", "cases_seed") or key in PER_DEVICE:
        return True
    base, _, device = key.rpartition("_")
    return device in DEVICES and base in PER_DEVICE


def load_course(path: str | Path | None = None, *, known: tuple[str, ...] | None = None) -> Course:
    """The course: the bundled ``course.toml`` with ``path`` laid over it, checked."""
    data, source = _laid_over(path)
    course_table, weights, grading = data.get("course", {}), data.get("weights", {}), data.get("grading", {})
    unknown = sorted(k for k in grading if not _known_grading_key(k))
    if unknown:
        raise CourseError(f"{source}: [grading] has unknown key(s) {', '.join(unknown)}")
    try:
        course = Course(
            name=str(course_table.get("name", "")),
            total=float(course_table.get("total", 0)),
            weights={str(k): float(v) for k, v in weights.items()},
            correctness=str(grading.get("correctness", "")),
            grading=dict(grading),
            source=source,
            slurm=_slurm_table(data.get("slurm", {}), source),
            speed_curves=_speed_curves(data.get("speed_curve", {}), source),
        )
        _check_settings(course)
    except CourseError:
        raise
    except (TypeError, ValueError) as exc:
        raise CourseError(f"{source}: {exc}") from None
    if known is not None:
        unknown = sorted(set(course.weights) - set(known))
        if unknown:  # a typo, or an exercise not written yet: say so, but grade the rest
            print(f"grader: warning: {source}: [weights] names unknown exercise(s) {', '.join(unknown)} "
                  f"(known: {', '.join(known)})", file=sys.stderr)
    return course


COURSE_TABLES = ("course", "weights", "grading", "slurm", "speed_curve", "serve")  # [serve]: grader.serve.policy's


def _laid_over(path: str | Path | None) -> tuple[dict[str, Any], str]:
    """The bundled course file's tables with those of ``path`` laid over them, and where they came from."""
    data = _read(COURSE_FILE)
    if path is None:
        return data, str(COURSE_FILE)
    path = Path(path)
    if not path.is_file():
        raise CourseError(f"{path}: no such course file")
    overlay = _read(path)
    unknown_tables = sorted(set(overlay) - set(COURSE_TABLES))
    if unknown_tables:
        raise CourseError(f"{path}: unknown table(s) {', '.join(unknown_tables)} (known: {', '.join(COURSE_TABLES)})")
    for table, values in overlay.items():
        if not isinstance(values, dict):
            raise CourseError(f"{path}: [{table}] must be a table")
        data[table] = {**data.get(table, {}), **values}
    return data, str(path)


def _check_settings(course: Course) -> None:
    """Every number of the course in its range, and the correctness mode one the grader knows."""
    source = course.source
    for key in PER_DEVICE:
        for device in DEVICES:
            value = course.setting(key, device)
            if value < 0 or (value == 0 and key not in ("random_cases", "jobs")):  # jobs 0: chosen per GPU
                raise CourseError(f"{source}: [grading] {key} must be positive, not {value}")
    if course.total <= 0:
        raise CourseError(f"{source}: [course] total must be positive, not {course.total}")
    if any(w < 0 for w in course.weights.values()):
        raise CourseError(f"{source}: weights must not be negative")
    if course.correctness not in CORRECTNESS_MODES:
        raise CourseError(f"{source}: [grading] correctness must be one of {', '.join(CORRECTNESS_MODES)}, "
                          f"not {course.correctness!r}")


SLURM_KEYS = {"partition": str, "gres": str, "time_limit": str, "max_parallel": int, "cpus_per_task": int,
              "mem": str, "extra_args": list}


def _slurm_table(table: Mapping[str, Any], source: str) -> dict[str, Any]:
    unknown = sorted(set(table) - set(SLURM_KEYS))
    if unknown:
        raise CourseError(f"{source}: [slurm] has unknown key(s) {', '.join(unknown)} (known: {', '.join(SLURM_KEYS)})")
    for key, kind in SLURM_KEYS.items():
        if key not in table:
            raise CourseError(f"{source}: [slurm] has no {key}")
        value = table[key]
        if not isinstance(value, kind) or (kind is list and not all(isinstance(v, str) for v in value)):
            expected = "a list of strings" if kind is list else kind.__name__
            raise CourseError(f"{source}: [slurm] {key} must be {expected}")
    if table["max_parallel"] < 0 or table["cpus_per_task"] < 1:
        raise CourseError(f"{source}: [slurm] max_parallel must be >= 0 and cpus_per_task >= 1")
    return dict(table)


@dataclass(frozen=True)
class SlurmSettings:
    """How a batch is submitted to Slurm (``grader grade --slurm``): the [slurm] table, with the command
    line's overrides."""

    partition: str
    gres: str
    time_limit: str
    max_parallel: int
    cpus_per_task: int
    mem: str
    extra_args: tuple[str, ...]

    @property
    def device(self) -> str:
        """Where the tasks grade: on a GPU when they ask Slurm for one (``--gres=gpu...``, ``--gpus...``)."""
        asks = "gpu" in self.gres.lower() or any(a.startswith(("--gpus", "-G")) for a in self.extra_args)
        return "cuda" if asks else "cpu"


def slurm_settings(course: Course, overrides: Mapping[str, Any]) -> SlurmSettings:
    values = {**course.slurm, **{k: v for k, v in overrides.items() if v is not None}}
    return SlurmSettings(partition=str(values["partition"]), gres=str(values["gres"]),
                         time_limit=str(values["time_limit"]), max_parallel=int(values["max_parallel"]),
                         cpus_per_task=int(values["cpus_per_task"]), mem=str(values["mem"]),
                         extra_args=tuple(values["extra_args"]))


@dataclass(frozen=True)
class GradeOptions:
    """What one ``grader grade`` run was asked for; None means "as the course file says"."""

    exercises: tuple[str, ...] = ()  # empty: all
    jobs: int | None = None
    timeout_s: float | None = None
    call_timeout_s: float | None = None
    random_cases: int | None = None
    memory_mb: int | None = None
    secret: str | None = None
    course: Path | None = None
    keep_work: bool = False
    profile: bool = False
    gpus: str | None = None  # "all", "0,2,3"; None: the current GPU
    processes: int | None = None  # grader processes a local batch is split over; None: one per GPU (one on a CPU)
    fresh: bool = False  # discard what the output folder holds and grade everything again
    regrade_changed: bool = False  # grade again, from scratch, the submissions whose files changed
    slurm: Mapping[str, Any] | None = None  # submit to Slurm, with these [slurm] overrides; None: grade here
    wait: bool = False  # Slurm: wait for the batch to end
    unsandboxed: bool = False  # grade without a sandbox where none can be built (said in run.json and every report)
    # where the hidden cases' inputs and references are kept (default OUT/staff/references): a grading server points
    # every batch it runs (one per submission, one secret) at one folder, so each case is computed once
    references: Path | None = None
    # on a GPU, the reference solutions timed beside every submission (RunSettings.yardstick); None: where the
    # solutions tree is present (a checkout of the course repository), else the GPU's thresholds file
    yardstick: bool | None = None
    # where the reference's recorded plans are kept (default: the user's cache folder, shared by every batch on the
    # host); ``grader serve`` keeps them in its own folder
    yardstick_cache: Path | None = None

    def replace(self, **changes: Any) -> GradeOptions:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return GradeOptions(**values)


@dataclass(frozen=True)
class RunSettings:
    """Everything one exercise run needs, resolved. The secret stays in the grader's process."""

    device: str
    secret: str
    random_cases: int
    timeout_s: float
    call_timeout_s: float
    memory_mb: int | None
    speed_budget_s: float
    workdir: Path  # private scratch space of this grading run
    gpu_name: str | None = None
    output_cap: int = 64 * 1024  # bytes of stdout and of stderr kept per worker
    result_cap_mb: int = 4096  # largest message from a worker
    # One Triton compilation of the student's kernels at most (compiling is not counted in a call's time limit)
    compile_timeout_s: float = 600.0
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for the worker (e.g. the GPU)
    cases_seed: str = ""  # the course's seed of every case (course.toml); "": each batch's secret
    speed_curves: Mapping[str, Curve] = field(default_factory=dict)  # the course's [speed_curve]
    sandbox: Sandbox | None = None  # where workers run; None: unsandboxed, in a process group only
    references: ReferenceStore | None = None  # the batch's shared case references; None: computed per run
    parallel_parts: bool = False  # each part of an exercise in workers of its own, side by side (GPUs)
    # with parallel_parts, each part's speed measurement in a worker of its own too: shortens a run alone, but costs
    # a worker start, so only where the GPUs have room for more runs than the batch has (one submission, a server)
    speed_apart: bool = False
    # before its cases, each worker compiles their kernels at once, on threads (grader.checks.compile_ahead), and
    # before its speed warm-up every benchmark's kernels and autotuning candidates: shortens a run alone; in a full
    # batch the cores are busy anyway and it gains nothing, so only where speed_apart is chosen
    compile_ahead: bool = False
    nice: int = 0  # the CPU niceness of the run's workers (:func:`grader.grading.batch.scheduler.niceness`)
    # the reference solutions, recorded once per batch and GPU and timed beside every student's kernels
    # (:mod:`grader.grading.exercise_run.yardstick_plans`); None: speed is credited against thresholds files
    yardstick: Path | None = None
    yardstick_cache: Path | None = None  # recorded plans kept across batches (GradeOptions.yardstick_cache)


def resolve(options: GradeOptions, course: Course, *, device: str, secret: str, workdir: Path,
            gpu_name: str | None = None, sandbox: Sandbox | None = None) -> RunSettings:
    def pick(value, key):
        return value if value is not None else course.setting(key, device)

    timeout = float(pick(options.timeout_s, "timeout_s"))
    return RunSettings(
        device=device,
        secret=secret,
        random_cases=int(pick(options.random_cases, "random_cases")),
        timeout_s=timeout,
        call_timeout_s=min(float(pick(options.call_timeout_s, "call_timeout_s")), timeout),
        memory_mb=int(pick(options.memory_mb, "memory_mb")),
        speed_budget_s=float(course.setting("speed_budget_s", device)),
        # optional in a course file: older ones have none
        compile_timeout_s=(course.setting("compile_timeout_s", device)
                           if {"compile_timeout_s", f"compile_timeout_s_{device}"} & set(course.grading)
                           else RunSettings.compile_timeout_s),
        workdir=workdir,
        gpu_name=gpu_name,
        sandbox=sandbox,
        cases_seed=course.cases_seed,
        speed_curves=dict(course.speed_curves),
        parallel_parts=device == "cuda",
        yardstick=(default_solutions() if options.yardstick is not False and device == "cuda"
                   and default_solutions().is_dir() else None),
        yardstick_cache=options.yardstick_cache,
    )


def default_solutions() -> Path:
    """The reference solutions: ``solutions/`` beside the grader package (a checkout of the course repository)."""
    return Path(__file__).resolve().parents[2] / "solutions"
