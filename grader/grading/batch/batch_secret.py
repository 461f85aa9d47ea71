"""The secret that seeds a batch's hidden cases: where it comes from (``--secret``, ``$GRADER_SECRET``, the output
folder's file, or made now), and the check that a batch joined later is given the same one (``run.json`` keeps only
its salted fingerprint)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from grader.grading import config
from grader.grading.batch import resume
from grader.grading.batch.context import UsageError
from grader.grading.results import store


@dataclass(frozen=True)
class Secret:
    value: str
    source: str  # "--secret", "$GRADER_SECRET" or the folder's file: what run.json records
    new: bool = False  # generated now: written to the folder when the batch is opened


def batch_secret(options: config.GradeOptions, out: Path, recorded: dict | None = None, *,
                 folder_only: bool = False) -> Secret:
    """The secret that seeds the batch's hidden cases: ``--secret``, else ``$GRADER_SECRET``, else the folder's file,
    else (a batch opened now) a fresh one. Joining the batch ``recorded`` (its run.json) it must be that batch's;
    ``folder_only`` (a Slurm task) reads only the folder's file, never the job's command or environment."""
    if folder_only:
        kept = store.read_secret(out)
        if not kept or not _is_recorded(kept, recorded or {}):
            raise UsageError(f"{out / store.SECRET_FILE} is missing or is not the batch's secret")
        return Secret(kept, store.SECRET_FILE)
    found = None
    if options.secret:
        found = Secret(options.secret, "--secret")
    elif os.environ.get("GRADER_SECRET"):
        found = Secret(os.environ["GRADER_SECRET"], "$GRADER_SECRET")
    elif kept := store.read_secret(out):
        found = Secret(kept, store.SECRET_FILE)
    if recorded is None:  # a batch opened now: open_batch checks it against what the folder holds
        return found or Secret(secrets.token_hex(16), store.SECRET_FILE, new=True)
    if found is None:
        raise UsageError(f"{out}: the run's secret came from {recorded.get('secret')}: give it again "
                         "(--secret or $GRADER_SECRET)")
    if not _is_recorded(found.value, recorded):
        raise UsageError(f"{out}: that is not the secret this run was graded with (it came from "
                         f"{recorded.get('secret')})")
    return found


def _is_recorded(secret: str, recorded: dict) -> bool:
    return resume.secret_fingerprint(secret, recorded.get("secret_salt", "")) == recorded.get("secret_fingerprint")
