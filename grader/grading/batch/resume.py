"""What a resumed batch must share with the run that started it, and what is left to grade.

``OUT/run.json`` records the batch's identity: a salted fingerprint of the secret, the course configuration
(its fingerprint and its decisions, to name what changed), the settings that decide scores (random cases,
limits, device) and, per student, a content hash of the prepared submission. Grading into an output
folder that holds a batch resumes it — only if all of that is unchanged; otherwise :class:`Conflict` names
each difference and says how to start fresh. Nothing is ever silently mixed.

A task is done when its result is committed (``state/<exercise>.json``) and needs no regrade; everything
else — never started, died (a stale marker: :mod:`grader.grading.batch.markers`), or needing a regrade — is left.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from grader.grading.batch.submission import Submission
from grader.grading.results import store

SCORE_SETTINGS = ("random_cases", "timeout_s", "call_timeout_s", "memory_mb")
START_FRESH = ("to grade everything again in this folder, add --fresh (it discards the folder's results); "
               "or grade into another --out")


class Conflict(Exception):
    """The output folder holds another batch (the message names every difference)."""


def secret_fingerprint(secret: str, salt: str) -> str:
    return hashlib.sha256(f"{salt}\x1f{secret}".encode()).hexdigest()[:16]


def content_hash(sub: Submission) -> str:
    """A digest of the prepared submission: every file's path and bytes (what is graded), or why there
    is nothing to grade."""
    digest = hashlib.sha256()
    if sub.root is None:
        digest.update(("unusable\x1f" + "\x1f".join(sub.problems)).encode())
        return digest.hexdigest()[:24]
    for path in sorted(p for p in sub.root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(sub.root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:24]


def _diff(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changes += _diff(a, b, f"{prefix}{key}.")
        elif a != b:
            changes.append(f"{prefix}{key}: {a!r} → {b!r}")
    return changes


def conflicts(recorded: Mapping[str, Any], current: Mapping[str, Any], secret: str) -> list[str]:
    """Why the batch in ``recorded`` (run.json) is not the one ``current`` describes."""
    problems = []
    if secret_fingerprint(secret, recorded.get("secret_salt", "")) != recorded.get("secret_fingerprint"):
        problems.append(f"the secret differs from the one the folder was graded with (that one came from "
                        f"{recorded.get('secret', '?')})")
    if recorded.get("course_fingerprint") != current["course_fingerprint"]:
        changes = _diff(recorded.get("course_decisions", {}), current["course_decisions"])
        problems.append(f"the course configuration changed ({current['course']})"
                        + (": " + "; ".join(changes) if changes else ""))
    if recorded.get("device_kind", current["device_kind"]) != current["device_kind"]:
        problems.append(f"the folder was graded on {recorded['device_kind']}, this run grades on "
                        f"{current['device_kind']}")
    if bool(recorded.get("unsandboxed", False)) != bool(current.get("unsandboxed", False)):
        was = "without a sandbox" if recorded.get("unsandboxed") else "in the sandbox"
        problems.append(f"the folder was graded {was}; this run would grade "
                        + ("without one (--unsandboxed)" if current.get("unsandboxed") else "in the sandbox"))
    was = recorded_yardstick(recorded)
    if was is not None and was != bool(current.get("yardstick")):
        problems.append("the folder's speed was credited " + _yardstick_said(was)
                        + "; this run would credit it " + _yardstick_said(current.get("yardstick")))
    for key in SCORE_SETTINGS:
        if key in recorded and recorded[key] != current[key]:
            problems.append(f"{key} is {current[key]} now, {recorded[key]} when the folder was graded")
    return problems


def recorded_yardstick(recorded: Mapping[str, Any]) -> bool | None:
    """Whether the batch in ``recorded`` (run.json) credited speed beside the reference solutions; a GPU batch
    recorded before the grader said so credited against the thresholds files (False); None: nothing to keep."""
    if "yardstick" in recorded:
        return bool(recorded["yardstick"])
    return False if recorded.get("device_kind") == "cuda" else None


def _yardstick_said(on: bool | None) -> str:
    return ("beside the reference solutions (the yardstick)" if on
            else "against the GPU's thresholds file (--no-yardstick)")


def refuse(out: Path, problems: Iterable[str], hint: str = START_FRESH) -> Conflict:
    lines = "\n".join(f"  - {p}" for p in problems)
    return Conflict(f"{out} holds a batch that this run must not be mixed with:\n{lines}\n{hint}")


def changed_submissions(out: Path, subs: Iterable[Submission], hashes: Mapping[str, str]) -> list[Submission]:
    """The submissions whose prepared files differ from those the folder graded under the same student id."""
    changed = []
    for sub in subs:
        try:
            recorded = store.load_submission(out, sub.student).get("content_hash")
        except (OSError, ValueError):
            continue  # a new student
        if recorded is not None and recorded != hashes[sub.student]:
            changed.append(sub)
    return changed


def merged_record(recorded: Mapping[str, Any] | None, current: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """run.json for the batch once this run joins it: the union of exercises (in course order) and of
    submissions; the secret's salt and the start time kept."""
    if not recorded:
        return {**current, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    merged = {**recorded, **current}
    names = set(recorded.get("exercises", [])) | set(current["exercises"])
    merged["exercises"] = [n for n in order if n in names]
    merged["submissions"] = {**recorded.get("submissions", {}), **current["submissions"]}
    for key in ("secret", "secret_salt", "secret_fingerprint", "started"):
        if key in recorded:
            merged[key] = recorded[key]
    merged["updated"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return merged
