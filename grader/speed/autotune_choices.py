"""A student's autotune choices shared between the student's workers.

A choice timed by one of a student's workers (``TUNE`` mode, :mod:`grader.speed.autotune`) is left in the student's
Triton cache, never shared by two students; another of the student's workers that makes the same choice (the same
kernel, key and candidates: FlashAttention's autograd part calls the forward kernel that the forward part tuned)
takes it from there instead of timing the candidates again. A choice is named by everything that could change it;
where something has no stable name (a pre-hook closing over a tensor), nothing is shared.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

# In the student's Triton cache (shared by the student's workers, never by two students): the choices timed.
SHARED_CHOICES = "grader-autotune"


@contextlib.contextmanager
def shadowed(tuner, name: str, value) -> Iterator[None]:
    """In the block, ``tuner.<name>`` is ``value``: an entry in the instance's dict, which shadows the class's
    method or cached property; whatever the instance had there before comes back after."""
    had = name in tuner.__dict__
    saved = tuner.__dict__.get(name)
    tuner.__dict__[name] = value
    try:
        yield
    finally:
        if had:
            tuner.__dict__[name] = saved
        else:
            tuner.__dict__.pop(name, None)


@contextlib.contextmanager
def choices_shared(tuner) -> Iterator[None]:
    """In the block (``TUNE`` mode), a choice of ``tuner`` another of the student's workers timed is taken from the
    student's Triton cache (the student's pruning then leaves that one candidate), and a choice timed here is left
    there for the others."""
    prune = tuner.prune_configs
    tuner._grader_shared = tuner._grader_to_share = tuner._grader_timed = tuner._grader_tuning = None

    def prune_and_share(*args, **kwargs):
        configs = prune(*args, **kwargs)
        tuner._grader_tuning, tuner._grader_timed = list(configs), None  # a new choice: timed at its first candidate
        if len(configs) > 1:
            path = shared_choice(tuner, configs, args[0] if args else kwargs.get("kwargs", {}))
            chosen = _read_choice(path, configs) if path is not None else None
            if chosen is not None:
                tuner._grader_shared, tuner._grader_tuning = chosen, [chosen]
                return [chosen]
            tuner._grader_to_share = (path, configs) if path is not None else None
        return configs

    try:
        with shadowed(tuner, "prune_configs", prune_and_share):
            yield
        shared = tuner._grader_to_share
        best = getattr(tuner, "best_config", None)
        if shared is not None and best is not None and tuner._grader_shared is None:
            path, configs = shared
            if any(best is c for c in configs):
                _write_choice(path, configs, best)
    finally:
        tuner._grader_shared = tuner._grader_to_share = tuner._grader_timed = tuner._grader_tuning = None


def shared_choice(tuner, configs: list, meta: dict) -> Path | None:
    """Where a choice of ``tuner`` among ``configs`` for this call's key is shared with the student's other workers:
    a file named by the kernel's source, the GPU, Triton, the key as Triton computes it and the candidates (hooks
    included); None where one of them has no stable name (nothing is shared)."""
    folder = os.environ.get("TRITON_CACHE_DIR")
    if not folder:
        return None
    try:
        import torch
        import triton

        kernel = tuner.fn
        while not hasattr(kernel, "cache_key") and hasattr(kernel, "fn"):
            kernel = kernel.fn
        named = {**(tuner.nargs or {}), **meta}
        named = {k: v for k, v in named.items() if k in tuner.arg_names}
        key = [named[k] for k in tuner.keys if k in named]
        key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
        if not _plain(key):
            return None
        hooks = [hook_name(c.pre_hook) for c in configs]
        names = [str(kernel.cache_key), torch.cuda.get_device_name(), triton.__version__, repr(list(tuner.keys)),
                 repr(key), *(f"{c}|{hook}" for c, hook in zip(configs, hooks))]
    except Exception:  # a Triton whose autotuner this module does not know: every worker times its own choices
        return None
    if None in hooks:
        return None
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
    return Path(folder) / SHARED_CHOICES / f"{digest}.json"


def hook_name(hook) -> str | None:
    """A config's pre-hook by its name and what it closes over (a FlashAttention's descriptor tiles), or None where
    it closes over anything but plain values (a tensor, a function: nothing is shared)."""
    if hook is None:
        return ""
    try:
        cells = tuple(cell.cell_contents for cell in (getattr(hook, "__closure__", None) or ()))
    except ValueError:  # a cell not filled yet
        return None
    if not _plain(cells):
        return None
    return f"{getattr(hook, '__module__', '')}.{getattr(hook, '__qualname__', '')}{cells!r}"


def _plain(value, depth: int = 0) -> bool:
    """Numbers, strings and small containers of them: what names a hook's closure the same way in every process."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return True
    if depth > 3 or not isinstance(value, (tuple, list, dict)) or len(value) > 64:
        return False
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else list(value)
    return all(_plain(item, depth + 1) for item in items)


def _read_choice(path: Path, configs: list):
    try:
        data = json.loads(path.read_text())
        index = int(data["index"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if 0 <= index < len(configs) and str(configs[index]) == data.get("config"):
        return configs[index]
    return None


def _write_choice(path: Path, configs: list, best) -> None:
    index = next(i for i, c in enumerate(configs) if c is best)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"index": index, "config": str(best)}))
        tmp.replace(path)
    except OSError:  # a full or read-only cache: the other workers time the choice themselves
        pass
