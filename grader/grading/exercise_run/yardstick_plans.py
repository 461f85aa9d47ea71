"""The yardstick: the reference solution's launch plans, recorded once per batch and GPU, for the trusted timer to
time in the same rounds as each student's.

A student's speed credit is ``reference_ms / student_ms`` measured in one run of the timer, on the same inputs, the
same GPU and the same clocks (:mod:`grader.speed.credit`), so it needs no thresholds file and no calibration of the
GPU. The reference's calls are recorded exactly as a student's are: the solutions tree (``RunSettings.yardstick``)
is graded for its speed items only, in a sandboxed worker (:func:`grader.grading.exercise_run.supervise.run`), its
autotuners choosing their configs with the same timing as a student's. The first exercise run of a batch that
needs an exercise's yardstick on a GPU records it, side by side with its own workers; every later run on that GPU
uses the same plans. A recording that fails is the grader's side: the parts are then credited against the GPU's
calibrated thresholds where it has them, else their speed waits for a regrade.

Complete recordings are kept in a folder (``RunSettings.yardstick_cache``: the user's cache folder,
:func:`default_cache`, or a server's own), each named by everything that could change it: the reference's files,
the grader's code, torch, Triton and the GPU. Every later batch on that GPU, and every upload of a server's term, is
then timed beside the same reference kernels, recorded once; removing the folder records them again.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

from grader.checks.spec import Exercise
from grader.grading.config import RunSettings
from grader.grading.exercise_run import item_plan, references, supervise
from grader.grading.exercise_run.case_references import CaseReferences
from grader.grading.exercise_run.slots import Slot
from grader.grading.isolation import bytecode, protocol
from grader.grading.results import store
from grader.speed.plan import LaunchPlan

KEPT = 32  # recordings kept per process (a server grades batch after batch): each holds a few MB of kernels
WAIT_S = 1800.0  # a recording that outlasts this is the grader's fault: speed falls back as if it failed


@dataclass
class Yardstick:
    """An exercise's reference plans on one GPU: part -> benchmark label -> plan, and what failed."""

    plans: dict[str, dict[str, LaunchPlan]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # "<part>: why it has no yardstick" (the grader's side)
    seconds: float = 0.0  # wall time of the recording
    cached: bool = False  # read from the cache folder, not recorded by this batch


_LOCK = threading.Lock()
_RECORDINGS: OrderedDict[tuple[str, ...], concurrent.futures.Future] = OrderedDict()


def start(exercise: Exercise, *, settings: RunSettings, slot: Slot | None) -> concurrent.futures.Future | None:
    """The recording of ``exercise``'s yardstick for this batch on ``slot``'s GPU, started now unless it was
    (None where there is nothing to record: no GPU, no solutions tree, no speed-graded part)."""
    root = settings.yardstick
    if settings.device != "cuda" or root is None or not any(p.speed_graded for p in exercise.parts):
        return None
    gpu = slot.device.get("uuid") or slot.name if slot is not None else "cuda"
    key = (str(settings.workdir), str(gpu), exercise.name)
    with _LOCK:
        future = _RECORDINGS.get(key)
        if future is None:
            future = concurrent.futures.Future()
            _RECORDINGS[key] = future
            while len(_RECORDINGS) > KEPT:
                _RECORDINGS.popitem(last=False)
            # in the batch's workspace, not the first run's scratch: that run may end (and remove it) first
            name = "".join(c if c.isalnum() else "-" for c in f"{gpu}-{exercise.name}")
            folder = settings.workdir / "yardstick" / name
            threading.Thread(target=_record_into, args=(future, exercise, root, settings, slot, folder),
                             name=f"yardstick {exercise.name}", daemon=True).start()
    return future


def result(future: concurrent.futures.Future | None) -> Yardstick | None:
    """The recording's result (waiting for it), or None where none was started."""
    if future is None:
        return None
    try:
        return future.result(timeout=WAIT_S)
    except Exception as exc:  # a fault of the grader's side: no yardstick
        return Yardstick(problems=[f"recording the reference solution failed: {type(exc).__name__}: {exc}"])


def _record_into(future: concurrent.futures.Future, exercise: Exercise, root: Path, settings: RunSettings,
                 slot: Slot | None, scratch: Path) -> None:
    try:
        future.set_result(record(exercise, root, settings=settings, slot=slot, scratch=scratch))
    except BaseException as exc:
        future.set_exception(exc)


def record(exercise: Exercise, root: Path, *, settings: RunSettings, slot: Slot | None, scratch: Path) -> Yardstick:
    """Record the speed items of ``exercise`` in the tree ``root`` (the reference solutions) in a sandboxed worker,
    as a student's are recorded, working in ``scratch``, and return their plans."""
    import time

    began = time.monotonic()
    kept = _cache_file(settings.yardstick_cache, exercise, root, slot)
    if kept is not None and kept.is_file():
        try:
            return _load(kept)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged file: record again
            print(f"grader: the kept yardstick {kept} is unreadable ({exc}); recording it again", flush=True)
    if slot is not None:
        settings = replace(settings, env={**settings.env, **slot.env}, gpu_name=slot.gpu_name or settings.gpu_name)
    items = [item for item in item_plan.plan(exercise, device="cuda", secret=settings.secret, random_cases=0,
                                             speed_budget_s=settings.speed_budget_s, cases_seed=settings.cases_seed)
             if item.kind == "speed"]
    refs = CaseReferences(settings.references or references.local(settings.secret), exercise.name)
    # Connected to the GPU's arbiter like a student's worker: its autotuners time their configs alone, and it
    # pauses for the students' turns.
    scratch.mkdir(parents=True, exist_ok=True)
    run = supervise.run(exercise, root, items, settings, scratch=scratch,
                        arbiter=slot.arbiter if slot is not None else None, defer_speed=True, references=refs)
    found = Yardstick()
    recorded = {item.part.name: reply for item, _, reply in run.to_time if isinstance(reply, protocol.SpeedDone)}
    for item in items:
        reply = recorded.get(item.part.name)
        if reply is None:
            why = run.failed.get(item.id) or "the reference's worker recorded nothing"
            found.problems.append(f"{item.part.name}: {why}")
            continue
        plans = {label: plan for label, plan in reply.measurement.plans.items() if isinstance(plan, LaunchPlan)}
        found.plans[item.part.name] = plans
        missing = [b.label for b in item.part.benchmarks if b.label not in plans]
        if missing:
            found.problems.append(f"{item.part.name}: the reference's calls on {', '.join(missing)} were not recorded")
    found.seconds = time.monotonic() - began
    if kept is not None and not found.problems:
        _save(kept, found)
    return found


def default_cache() -> Path:
    """The user's cache folder for recordings (``$XDG_CACHE_HOME/grader/yardstick``, else ``~/.cache/...``): no
    sandbox sees it (they see the bytecode folder beside it only)."""
    return bytecode.grader_cache() / "yardstick"


def _cache_file(folder: Path | None, exercise: Exercise, root: Path, slot: Slot | None) -> Path | None:
    """Where a recording of ``exercise`` is kept in ``folder``: named by a digest of what could change it."""
    if folder is None:
        return None
    import torch
    import triton

    import grader

    digest = hashlib.sha256()
    for value in (exercise.name, torch.__version__, triton.__version__, torch.version.cuda or "",
                  (slot.device.get("uuid") or slot.name) if slot is not None else "cuda",
                  slot.gpu_name if slot is not None else "", _files_digest(Path(grader.__file__).parent),
                  _files_digest(root / exercise.name)):
        digest.update(str(value).encode() + b"\0")
    return folder / f"{exercise.name}-{digest.hexdigest()[:24]}.json"


def _files_digest(base: Path) -> str:
    """A digest of the source files under ``base`` (names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in base.rglob("*") if p.is_file() and p.suffix in (".py", ".toml")):
        digest.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _load(path: Path) -> Yardstick:
    data = json.loads(path.read_text())
    plans = {part: {label: LaunchPlan.from_dict(plan) for label, plan in by_label.items()}
             for part, by_label in data["plans"].items()}
    return Yardstick(plans=plans, seconds=0.0, cached=True)


def _save(path: Path, found: Yardstick) -> None:
    """Written whole or not at all, owner-only (the folder may be a server's)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = {"plans": {part: {label: plan.to_dict() for label, plan in by_label.items()}
                      for part, by_label in found.plans.items()}}
    store.write_atomic(path, json.dumps(data), mode=0o600)
