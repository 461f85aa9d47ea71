"""What of a submission is graded: students hand in whole clones, so what cannot be student code is left out
before any limit applies, and the limits then apply to what is kept.

Left out, at any depth: virtual environments (``.venv/``, ``venv/``, any folder holding ``pyvenv.cfg``),
installed packages (``site-packages/``, ``node_modules/``, ``*.egg-info/``), build output (``build/``,
``dist/``), caches and version control (``__pycache__/``, ``.git/``, ...), and any file over
:data:`MAX_FILE_BYTES` that is not an exercise module. Caches and version control are left out silently (nothing
a student needs to hear of); the rest is named in a note (:func:`note`). Nothing left out is copied or unpacked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

MAX_BYTES = 64 << 20  # what is kept of one submission
MAX_FILES = 5000
MAX_FILE_BYTES = 1 << 20  # one file that is not an exercise module: far above any hand-written source
BOMB_RATIO = 100  # a zip unpacking to more than this many times its size (and over MAX_BYTES) is a zip bomb

QUIET = frozenset({"__pycache__", ".git", ".ipynb_checkpoints", "__MACOSX", ".hypothesis", ".pytest_cache"})
NOTED = frozenset({".venv", "venv", "node_modules", "site-packages", "build", "dist"})
VENV_MARKER = "pyvenv.cfg"  # what makes a folder of any name (``env/``, ``myenv/``) a virtual environment
MAX_NOTED = 8  # entries named in the note; the rest are counted


@dataclass(frozen=True)
class Entry:
    """One entry of a submission, by its path inside it."""

    path: PurePosixPath
    kind: str  # "file" | "dir" | "link" | "other"
    size: int = 0
    ref: object = field(default=None, compare=False)  # the zip member, for unpacking


@dataclass
class Selection:
    kept: list[Entry]  # files and folders to copy or unpack
    links: list[Entry]  # symbolic links outside left-out folders: not graded, and said so
    skipped: list[str]  # what was left out and why, for the note


def skipped_name(name: str) -> bool:
    """A folder name that is never student code, whatever it holds."""
    return name in QUIET or name in NOTED or name.endswith(".egg-info")


def select(entries: Iterable[Entry], modules: set[tuple[str, str]]) -> Selection:
    """Split ``entries`` into what is graded and what is left out; ``modules`` are the exercise modules'
    ``(folder, file name)`` pairs, which no size bound leaves out (the limits on what is kept still apply)."""
    entries = list(entries)
    venvs = {e.path.parent for e in entries if e.path.name == VENV_MARKER and e.kind == "file"}
    dropped: Counter[PurePosixPath] = Counter()  # left-out folder -> entries under it
    selection = Selection([], [], [])
    for entry in entries:
        parts = entry.path.parts
        # a file named like a cache or .git (a submodule's pointer) goes with them
        folders = parts if entry.kind == "dir" or (parts and parts[-1] in QUIET) else parts[:-1]
        top = next(
            (
                PurePosixPath(*parts[: i + 1])
                for i, name in enumerate(folders)
                if skipped_name(name) or PurePosixPath(*parts[: i + 1]) in venvs
            ),
            None,
        )
        if top is not None:
            dropped[top] += entry.kind != "dir"
        elif entry.kind == "link":
            selection.links.append(entry)
        elif entry.kind == "dir":
            selection.kept.append(entry)
        elif entry.kind == "file":
            if entry.size > MAX_FILE_BYTES and parts[-2:] not in modules:
                selection.skipped.append(
                    f"{entry.path} ({human(entry.size)}: over the {human(MAX_FILE_BYTES)} bound for a file)"
                )
            else:
                selection.kept.append(entry)
    selection.skipped[:0] = [
        f"{top}/ ({_files(count)})" for top, count in sorted(dropped.items()) if top.name not in QUIET
    ]
    return selection


def note(skipped: list[str]) -> str | None:
    """The one line that tells the student what was not graded, or None when nothing worth saying was."""
    if not skipped:
        return None
    more = len(skipped) - MAX_NOTED
    return (
        "skipped (not student code, not graded): "
        + ", ".join(skipped[:MAX_NOTED])
        + (f" and {more} more" if more > 0 else "")
    )


def over_limits(kept: list[Entry]) -> str | None:
    """Why what is kept is still too much — the limit and where most of it is — or None."""
    files = [e for e in kept if e.kind == "file"]
    size = sum(e.size for e in files)
    if len(files) > MAX_FILES:
        where = ", ".join(_largest(files, by_size=False))
        return f"more than the limit of {MAX_FILES} files to grade ({len(files)} kept); most are in {where}"
    if size > MAX_BYTES:
        where = ", ".join(_largest(files, by_size=True))
        return f"more than the limit of {human(MAX_BYTES)} to grade ({human(size)} kept); the largest: {where}"
    return None


def _largest(files: list[Entry], *, by_size: bool, top: int = 5) -> list[str]:
    """Where most of ``files`` are, with counts and sizes: down every folder that holds nearly all of them in its
    subfolders (so a clone's single top folder says nothing), then the biggest subfolders and files there."""
    prefix: tuple[str, ...] = ()
    ranked = _groups(files, prefix, by_size)
    while True:
        name, tally = ranked[0]
        if name is None or tally[by_size] < 0.9 * sum(t[by_size] for _, t in ranked):
            break
        inner = _groups(files, (*prefix, name), by_size)
        if inner[0][0] is None:  # mostly its own files: the folder itself is the best name for them
            break
        prefix, ranked = (*prefix, name), inner
    out = []
    for name, (count, size) in ranked[:top]:
        if name is not None:
            out.append(f"{'/'.join((*prefix, name))}/ ({_files(count)}, {human(size)})")
        elif count == 1:
            one = next(f for f in files if f.path.parts[:-1] == prefix)
            out.append(f"{one.path} ({human(size)})")
        else:
            where = f"in {'/'.join(prefix)}/" if prefix else "at the top"
            out.append(f"the files directly {where} ({_files(count)}, {human(size)})")
    return out


def _groups(files: list[Entry], prefix: tuple[str, ...], by_size: bool) -> list[tuple[str | None, list[int]]]:
    """``[(subfolder, [files, bytes])]`` under ``prefix``, largest first; None stands for its own files."""
    groups: dict[str | None, list[int]] = {}
    for f in files:
        parts = f.path.parts
        if parts[: len(prefix)] == prefix and len(parts) > len(prefix):
            tally = groups.setdefault(parts[len(prefix)] if len(parts) > len(prefix) + 1 else None, [0, 0])
            tally[0] += 1
            tally[1] += f.size
    return sorted(groups.items(), key=lambda item: (-item[1][by_size], item[0] or ""))


def _files(count: int) -> str:
    return f"{count} file{'s' * (count != 1)}"


def human(size: int) -> str:
    """``512 bytes``, ``1.5 MB``, ``200 MB`` (binary units, as the limits are written)."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale - (scale >> 11):  # 1023.99 KB reads 1 MB, never 1024 KB
            value = size / scale
            text = f"{value:.1f}" if value < 10 else f"{value:.0f}"
            return f"{text.removesuffix('.0')} {unit}"
    return f"{size} bytes"
